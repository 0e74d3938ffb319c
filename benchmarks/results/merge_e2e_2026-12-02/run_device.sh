# One device call (from the repository root): the ALR-KVD kernel with the merge inside stage 1 at B=2 and 4 (not
# measured when the merge moved), and the end-to-end decode step of dummy Qwen3-30B-A3B at 32k again (its last
# measurement predates the merge change); the kernel tests compiled first.
export PYTHONPATH=. ; D=benchmarks/results/merge_e2e_2026-12-02
timeout 200 python -m pytest -q tests/test_kernels_alrkvd_attention.py tests/test_cuda_graphs.py 2>&1 \
    | grep -E "Assertion|FAILED|passed|failed" | head
timeout 150 python benchmarks/bench_attention.py --no-tune --variants alrkvd-r16 --batches 1 2 4 --lengths 4096 32768 \
    --out $OUT/attention_b124_h200.json 2>&1 | grep -v "no tuned" | tail -12
timeout 300 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 1,8 --contexts 32768 \
    --kv-formats fp16,alrkvd --modes graphs --steps 20 --out $OUT/engine_e2e_h200.json 2>&1 | tail -12
