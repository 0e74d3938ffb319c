# Device call 7 (from the repository root): the engine's decode step at B=8 L=32k after the split count counts the
# windows (the engine's shape, 4 kv heads: 15 splits instead of 16), fp16 against rotated ALR-KVD, CUDA graphs.
export PYTHONPATH=.
timeout 200 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 8 --contexts 32768 \
    --kv-formats fp16,alrkvd-rotated --modes graphs --steps 20 --out $OUT/engine_e2e2_h200.json 2>&1 | tail -5
