# Device call 5 (from the repository root): issue 4's table with the kernel as committed (codes straight to tl.dot),
# both key frames; then the engine step at B=8, 32k with the rotated kernel against fp16 in one process.
export PYTHONPATH=.
timeout 170 python benchmarks/bench_attention.py --no-tune --variants alrkvd-r16 alrkvd-rot-r16 alrkvd-r32 \
    alrkvd-rot-r32 alrkvd-r64 alrkvd-rot-r64 alrkvd-mixed alrkvd-rot-mixed --out $OUT/attention_table_final_h200.json 2>&1 \
    | grep -v "no tuned"
timeout 120 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 8 --contexts 32768 \
    --kv-formats fp16,alrkvd-rotated --modes graphs --steps 20 --out $OUT/engine_e2e_final_h200.json 2>&1 | tail -6
