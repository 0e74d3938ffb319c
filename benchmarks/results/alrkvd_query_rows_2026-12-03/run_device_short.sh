# Device call 2 (from the repository root): launches of the ALR-KVD kernel at short contexts (B=8 L=4k was 0.87x
# of SDPA with the 2-warp launch, 40.4 against 48.4 us with 4 warps capped at 160 registers in call 1), rank 16
# rotated keys; then the paged fp16 and KIVI kernels with the group padded to 16 rows against 4.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_query_rows_2026-12-03
timeout 200 python benchmarks/compare_kernels.py --out $OUT/probe_short_h200.json \
    --arms now w4:NUM_WARPS_MANY_PAIRS=4 w4r160:NUM_WARPS_MANY_PAIRS=4,maxnreg=160 r168:maxnreg=168 \
    --shapes 8x4096 8x8192 8x16384 16x4096 32x4096 4x4096 4x32768 2>&1 | grep -v "no tuned" > $OUT/probe_short.log
tail -9 $OUT/probe_short.log
timeout 200 python $D/probe_pad.py $OUT/probe_pad_h200.json 2>&1 | grep -v "no tuned" > $OUT/probe_pad.log
tail -7 $OUT/probe_pad.log
