# Device call 3 (from the repository root): end to end through the engine, dummy Qwen3-30B-A3B at 32k, fp16 against
# ALR-KVD with key_frame=post_rope and =rotated in one process; then the greedy tokens of the rotated kernel path
# against the PyTorch path (dummy SmolLM2 shape, float32).
export PYTHONPATH=.
timeout 400 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 1,8 --contexts 32768 \
    --kv-formats fp16,alrkvd,alrkvd-rotated --modes graphs --steps 20 --out $OUT/engine_e2e_h200.json 2>&1 | tail -12
timeout 150 python benchmarks/bench_engine.py --gpu-alrkvd-tokens --tokens-formats alrkvd-rotated \
    --out $OUT/tokens_h200.json 2>&1 | tail -5
