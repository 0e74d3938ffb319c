# Ran on the tree of commit 3742036: check that commit out to measure the same code.
# Device call 6 (from the repository root): launch configurations at many pairs (probe_launch.py many).
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_int8_residual_2026-12-02
timeout 300 python $D/probe_launch.py $OUT/configs_h200.json many 2>&1 | grep -v "no tuned"
