# NOT RUN: the H200 could not be started again in the session's device time (2026-12-03). Meant for the tree of commit
# 100bae1 or later. Its table ran in the next session on the same kernel (c1cea8a):
# benchmarks/results/alrkvd_head_groups_2026-12-03/run_device_tiles.sh.
# Device call 5 (from the repository root): issue 4's table with this session's final
# kernel (scales one tile ahead, biased codes unpacked by inline PTX, the 2-warp launch capped at 168 registers at
# rank <= 16); the engine's decode step at B=8, 32k (B=1 left out for the device time left); the device memory the first launches take.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_pipeline_2026-12-03
timeout 60 python $D/local_memory.py 2>&1 | grep -v "no tuned"
# (the kernel tests compiled ran in call 3, before the register cap; call 4's check passed at every cap; left out
# here for the device time left)
timeout 220 python benchmarks/bench_attention.py --no-tune --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 \
    alrkvd-rot-mixed alrkvd-r16 --out $OUT/attention_table_final_h200.json 2>&1 | grep -v "no tuned" \
    | grep -E "alrkvd-rot-r16|sdpa|date"
timeout 150 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 8 --contexts 32768 \
    --kv-formats fp16,alrkvd-rotated --modes graphs --steps 20 --out $OUT/engine_e2e_h200.json 2>&1 | tail -6
