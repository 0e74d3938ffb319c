# Device call 4 (from the repository root; ran on the tree of commit 45563d2): issue 4's table with the kernel's new
# launch (whole 128-token blocks per tile at every launch, no register caps; the later rule that keeps 64-token tiles
# for the 2-warp launch's heavier loops was not run) and the engine's decode step at B=8, 32k, fp16 against
# rotated ALR-KVD.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_head_groups_2026-12-03
timeout 130 python benchmarks/bench_attention.py --no-tune --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 \
    alrkvd-rot-mixed alrkvd-r16 --out $OUT/attention_table_n128_h200.json 2>&1 | grep -v "no tuned" \
    > $OUT/attention_table_n128.log
grep -E "alrkvd-rot-r16|date" $OUT/attention_table_n128.log
timeout 150 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 8 --contexts 32768 \
    --kv-formats fp16,alrkvd-rotated --modes graphs --steps 20 --out $OUT/engine_e2e_h200.json 2>&1 | tail -8
