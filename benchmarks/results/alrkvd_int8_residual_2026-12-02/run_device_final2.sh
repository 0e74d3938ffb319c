# Ran on the tree of commit 1eb56c0: check that commit out to measure the same code.
# Device call 5 (from the repository root): the kernel tests compiled; issue 4's table with this session's final
# kernel (window not pipelined, splits in whole waves, 4-warp registers capped at 160); the engine step at 32k.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_int8_residual_2026-12-02
timeout 150 python -m pytest -q tests/test_kernels_alrkvd_attention.py tests/test_kernels_paged_attention.py 2>&1 | grep -E "Error|FAILED|passed|failed" | head
timeout 200 python benchmarks/bench_attention.py --no-tune --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 \
    alrkvd-rot-mixed alrkvd-r16 --out $OUT/attention_table_final_h200.json 2>&1 | grep -v "no tuned" | grep -E "alrkvd|sdpa|date"
timeout 220 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 1,8 --contexts 32768 \
    --kv-formats fp16,alrkvd-rotated --modes graphs --steps 20 --out $OUT/engine_e2e_final_h200.json 2>&1 | tail -5
