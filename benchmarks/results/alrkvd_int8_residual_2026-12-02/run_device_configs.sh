# Device call 6 (from the repository root): launch configurations at many pairs (probe_configs.py).
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_int8_residual_2026-12-02
timeout 300 python $D/probe_configs.py $OUT/configs_h200.json 2>&1 | grep -v "no tuned"
