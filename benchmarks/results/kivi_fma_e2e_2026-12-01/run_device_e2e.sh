# Second device call: greedy tokens through the engine (kernels against the PyTorch path, graphs against eager; kivi2 has
# no kernel at the dummy SmolLM2 head_dim 64, so its tokens take kivi4), and the
# decode step of dummy Qwen3-30B-A3B per KV format with CUDA graphs.
set -x
export PYTHONPATH=.
timeout 200 python benchmarks/bench_engine.py --gpu-alrkvd-tokens --tokens-formats alrkvd,kivi4 --out $OUT/tokens_h200.json 2>&1 | tail -15
timeout 380 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 1,8 --contexts 4096,32768 \
    --kv-formats fp16,alrkvd,kivi2,kivi4 --modes graphs --steps 20 --out $OUT/engine_e2e_h200.json 2>&1 | tail -30
