# Device call 3 (from the repository root): the kernel as committed (2d467da: dots transposed, bytes to fp16 two per
# instruction with their biases taken off per column, values' codes token-contiguous): the ALR-KVD kernel tests
# and the compression kernel's tests compiled, then the A/B against the kernel of the session's start
# (alrkvd_attention_before.py) per variant; arms: w2 = 2 warps at every batch, n128 = 128-token tiles for the
# heavy loops (rank_max > 32 or post_rope) too.
# (the snapshot is not kept in the repository: git show a4a7ef6:kernels/alrkvd_attention.py > $D/alrkvd_attention_before.py)
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_transposed_2026-12-03
timeout 200 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py tests/test_kernels_alrkvd_compress.py 2>&1 \
    | tail -2 | tee $OUT/kernel_tests_kept.log
timeout 150 python benchmarks/compare_kernels.py --out $OUT/kept_rot.json --before $D/alrkvd_attention_before.py \
    --arms before now w2:num_warps=2 2>&1 | grep -v "no tuned" > $OUT/kept_rot.log
timeout 90 python benchmarks/compare_kernels.py --out $OUT/kept_post.json --before $D/alrkvd_attention_before.py \
    --variant alrkvd-r16 --arms before now n128:BLOCK_N_MANY_PAIRS_HEAVY=128 --shapes 8x32768 32x32768 8x4096 1x4096 \
    2>&1 | grep -v "no tuned" > $OUT/kept_post.log
timeout 90 python benchmarks/compare_kernels.py --out $OUT/kept_r64.json --before $D/alrkvd_attention_before.py \
    --variant alrkvd-rot-r64 --arms before now n128:BLOCK_N_MANY_PAIRS_HEAVY=128 --shapes 8x32768 32x32768 8x4096 1x4096 \
    2>&1 | grep -v "no tuned" > $OUT/kept_r64.log
for f in rot post r64; do tail -7 $OUT/kept_$f.log; done
