# One device call (from the repository root): the KIVI kernel tests compiled, the KIVI A/B, the ALR-KVD warps
# between 8 and 64 pairs, greedy tokens through the engine, and the end-to-end decode step per KV format.
set -x
export PYTHONPATH=. ; D=benchmarks/results/kivi_fma_e2e_2026-12-01
nvidia-smi --query-gpu=name,memory.used --format=csv
timeout 150 python -m pytest -q tests/test_kernels_kivi_attention.py 2>&1 | tail -3
timeout 150 python $D/bench_kivi_fma.py $OUT 2>&1 | tail -45
timeout 120 python $D/bench_alr_pairs.py $OUT 2>&1 | grep -v "^$" | tail -40
