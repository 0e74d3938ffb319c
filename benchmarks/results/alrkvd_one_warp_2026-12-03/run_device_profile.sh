# Device call 2 (from the repository root): the tree as committed (4fce1c5: the review's refactor and the LONG_TOKENS
# rule, not compiled on the H200 before): the ALR-KVD kernel tests compiled; Nsight Compute on one launch of stage 1
# (B=8 L=32k, rotated keys rank 16: stalls, pipes, shared-memory wavefronts and bank conflicts); issue 4's table.
export PYTHONPATH=.
timeout 200 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py 2>&1 | tail -2 | tee $OUT/kernel_tests.log
timeout 240 python benchmarks/profile_alrkvd.py --ncu --variant alrkvd-rot-r16 --out-dir $OUT/prof > $OUT/prof.log 2>&1
ncu=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); ncu=${ncu:-ncu}
$ncu -i $OUT/prof/stage1.ncu-rep --page raw --csv > $OUT/prof/raw.csv 2>&1
grep -E "Duration|Registers|Achieved Occupancy|Issue Slots Busy|Executed Ipc|Bank Conflict|Warp Cycles Per Issued" \
    $OUT/prof/details.txt | head -20
timeout 200 python benchmarks/bench_attention.py --no-tune --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 \
    alrkvd-rot-mixed alrkvd-r16 kivi2 --out $OUT/attention_table_h200.json 2>&1 | grep -v "no tuned" \
    > $OUT/attention_table.log
grep -E "alrkvd-rot-r16|copy" $OUT/attention_table.log | head -12
