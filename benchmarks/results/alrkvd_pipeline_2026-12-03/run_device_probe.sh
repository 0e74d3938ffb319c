# Device call 1 (from the repository root): the kernel tests compiled; the pipeline probe (before/after the scales
# were loaded one tile ahead, at 2, 3 and 4 stages); Nsight Compute on the after kernel at B=8 L=32k, rank 16.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_pipeline_2026-12-03
# timeout 150 python -m pytest -q tests/test_kernels_alrkvd_attention.py 2>&1 | grep -E "Error|FAILED|passed|failed" | head
timeout 330 python $D/probe_pipeline.py $OUT/probe_pipeline_h200.json 2>&1 | grep -v "no tuned" > $OUT/probe_pipeline.log
# timeout 150 python benchmarks/profile_alrkvd.py --ncu --variant alrkvd-rot-r16 --out-dir $OUT/prof > $OUT/ncu.log 2>&1
# grep -E "Warp Cycles Per Issued|Issued Ipc|Achieved Occupancy|Registers Per|Stall" $OUT/prof/details.txt | head -20
tail -12 $OUT/probe_pipeline.log
