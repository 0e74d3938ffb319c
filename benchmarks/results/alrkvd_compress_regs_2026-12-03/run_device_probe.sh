# Device call 4 of 2026-12-03 (from the repository root): the compression kernel's registers as the JIT builds it on
# the H200, and one decode step's compression with and without a register budget; its tests compiled first.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_compress_regs_2026-12-03
timeout 150 python -m pytest -q -x tests/test_kernels_alrkvd_compress.py 2>&1 | tail -2 | tee $OUT/compress_tests.log
timeout 250 python $D/probe_regs.py $OUT/probe_regs_h200.json 2>&1 | grep -v "no tuned" > $OUT/probe_regs.log
tail -5 $OUT/probe_regs.log
