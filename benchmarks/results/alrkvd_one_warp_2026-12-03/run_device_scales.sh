# Device call 4 (from the repository root): the residual scales and zeros loaded in the tile that uses them, where
# Triton's pipeliner streams them with the codes (128-token tiles at 2 warps: 4 bytes a thread) in the layout of their
# use, instead of a tile ahead by hand and then converted through shared memory (main loop 1,674 -> 1,658 SASS,
# barriers 19 -> 11 a tile; CPU compile). The kernel tests compiled; the A/B against the kernel before it
# (alrkvd_attention_ahead.py, made by git show 694cf7b:kernels/alrkvd_attention.py; not kept in the repository),
# rotated keys rank 16; then issue 4's table.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_one_warp_2026-12-03
timeout 110 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py 2>&1 | tail -2 | tee $OUT/kernel_tests_scales.log
timeout 120 python benchmarks/compare_kernels.py --out $OUT/scales_rot.json --before $D/alrkvd_attention_ahead.py \
    --arms before now --shapes 8x32768 32x32768 8x131072 8x4096 1x4096 1x131072 2>&1 | grep -v "no tuned" \
    > $OUT/scales_rot.log
tail -7 $OUT/scales_rot.log
timeout 150 python benchmarks/bench_attention.py --no-tune --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 \
    alrkvd-rot-mixed alrkvd-r16 kivi2 --out $OUT/attention_table_final_h200.json 2>&1 | grep -v "no tuned" \
    > $OUT/attention_table_final.log
grep -E "alrkvd-rot-r16|alrkvd-rot-r64|alrkvd-r16|copy" $OUT/attention_table_final.log | head -30
