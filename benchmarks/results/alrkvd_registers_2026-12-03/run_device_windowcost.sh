# Device call 6 (from the repository root): the split count with the window's program counted at 2.5 tiles in the
# 2-warp launch (WINDOW_TILES_MANY_PAIRS; call 5 counted it as a whole program) against the kernel at 4141e24
# (before: its file from make_kernels.sh, the same split rule without the windows). Rotated keys, rank 16.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_registers_2026-12-03
timeout 300 python benchmarks/compare_kernels.py --out $OUT/windowcost.json --before $D/alrkvd_attention_4141e24.py \
    --arms before now --shapes 8x4096 8x8192 8x16384 8x32768 16x4096 4x4096 1x4096 2>&1 | grep -v "no tuned" \
    > $OUT/windowcost.log
tail -9 $OUT/windowcost.log
