# The last device call of the merge change (from the repository root): the kernel tests and the CUDA-graph tests
# compiled, the A/B of every decode kernel, the greedy tokens through the engine.
export PYTHONPATH=. ; D=benchmarks/results/fused_reduce_2026-12-01
timeout 240 python -m pytest -q tests/test_kernels_paged_attention.py tests/test_kernels_alrkvd_attention.py \
    tests/test_kernels_kivi_attention.py tests/test_cuda_graphs.py 2>&1 | grep -E "Assertion|FAILED|passed|failed" | head
timeout 200 python $D/bench_merge_all.py $OUT 2>&1 | grep -v "no tuned"
timeout 100 python benchmarks/bench_engine.py --gpu-alrkvd-tokens --tokens-formats alrkvd,kivi4 --out $OUT/tokens_h200.json \
    2>&1 | grep -E '"equal"|first_difference|graphs_equal' | tr -d ' \n'; echo
