# Device call 5 (from the repository root): the split count's waves counting the window's program (one more per
# (sequence, kv head): the windows past a whole wave run after the closed splits, last) against the tree. Rotated
# keys, rank 16.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_registers_2026-12-03
timeout 300 python benchmarks/compare_kernels.py --out $OUT/waves.json --arms now ww@$D/try_window_waves.py \
    --shapes 8x4096 8x16384 8x32768 8x131072 4x4096 32x4096 32x32768 2>&1 | grep -v "no tuned" > $OUT/waves.log
tail -9 $OUT/waves.log
