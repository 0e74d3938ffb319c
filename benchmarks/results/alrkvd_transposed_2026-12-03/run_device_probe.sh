# Device call 1 (from the repository root): every dot of the ALR-KVD kernel's loop transposed (tokens, head dims or
# ranks on the mma's 16-row side, the query group on its 8-column side), bytes to fp16 two per instruction; the
# kernel tests compiled, then the A/B against the kernel of the session's start (alrkvd_attention_before.py, made by
# git show a4a7ef6:kernels/alrkvd_attention.py), rotated keys rank 16, then post_rope.
# (the snapshot is not kept in the repository: git show a4a7ef6:kernels/alrkvd_attention.py > $D/alrkvd_attention_before.py)
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_transposed_2026-12-03
timeout 120 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py 2>&1 | tail -2 | tee $OUT/kernel_tests.log
timeout 200 python benchmarks/compare_kernels.py --out $OUT/probe_rot.json --before $D/alrkvd_attention_before.py \
    --arms before now n64:BLOCK_N=64 w4:NUM_WARPS_MANY_PAIRS=4 2>&1 | grep -v "no tuned" > $OUT/probe_rot.log
timeout 100 python benchmarks/compare_kernels.py --out $OUT/probe_post.json --before $D/alrkvd_attention_before.py \
    --variant alrkvd-r16 --arms before now --shapes 8x32768 32x32768 1x4096 2>&1 | grep -v "no tuned" > $OUT/probe_post.log
tail -8 $OUT/probe_rot.log; tail -4 $OUT/probe_post.log
