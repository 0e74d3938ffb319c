# Device call 4 (from the repository root): the engine's decode step at 32k with the tree as committed (window tiles
# of 64 tokens in the 2-warp launch), dummy Qwen3-30B-A3B, fp16 against rotated ALR-KVD, CUDA graphs.
export PYTHONPATH=.
timeout 400 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 1,8 --contexts 32768 \
    --kv-formats fp16,alrkvd-rotated --modes graphs --steps 20 --out $OUT/engine_e2e_h200.json 2>&1 | tail -12
