# Device calls 1 and 2 (from the repository root), on the tree of commit 2636ea9 (call 2 with 94a2254's fix of the
# probe). Call 1 ran all four steps: the
# kernel tests compiled (28 passed), the pipeline probe (before/after the scales were loaded one tile ahead, at 2, 3
# and 4 stages), which stopped at its first compile (n_regs read before the binary was loaded; fixed since), and
# Nsight Compute on the after kernel at B=8 L=32k, rank 16 (ncu_after_details.txt). Call 2 ran the probe alone
# (the other steps commented out, as below).
# Before the call: git show 7f8e501:kernels/alrkvd_attention.py > $D/alrkvd_attention_before.py (the kernel at the
# session's start; not committed, a copy of that commit's file).
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_pipeline_2026-12-03
# timeout 150 python -m pytest -q tests/test_kernels_alrkvd_attention.py 2>&1 | grep -E "Error|FAILED|passed|failed" | head
timeout 330 python $D/probe_pipeline.py $OUT/probe_pipeline_h200.json 2>&1 | grep -v "no tuned" > $OUT/probe_pipeline.log
# timeout 150 python benchmarks/profile_alrkvd.py --ncu --variant alrkvd-rot-r16 --out-dir $OUT/prof > $OUT/ncu.log 2>&1
# grep -E "Warp Cycles Per Issued|Issued Ipc|Achieved Occupancy|Registers Per|Stall" $OUT/prof/details.txt | head -20
tail -12 $OUT/probe_pipeline.log
