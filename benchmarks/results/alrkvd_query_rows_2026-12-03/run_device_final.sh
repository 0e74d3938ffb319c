# Device call 3 (from the repository root): the tree as kept (ALR-KVD and KIVI with the group padded to a power of
# two, the paged fp16 kernel back at 16 rows after call 2). First whether the 2-warp launch's heavier loops
# (rank_max > 32, post_rope), kept at 64-token tiles in section 2l, still are better there with 4-row dots; then
# issue 4's table and the engine's decode step at 32k.
export PYTHONPATH=.
for v in alrkvd-rot-mixed alrkvd-rot-r64 alrkvd-r16; do
  timeout 100 python benchmarks/compare_kernels.py --out $OUT/probe_heavy_$v.json --variant $v \
      --arms now n128:BLOCK_N_MANY_PAIRS_HEAVY=128 --shapes 8x32768 32x32768 8x4096 2>&1 | grep -v "no tuned" \
      > $OUT/probe_heavy_$v.log
  tail -4 $OUT/probe_heavy_$v.log
done
timeout 120 python benchmarks/bench_attention.py --no-tune --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 \
    alrkvd-rot-mixed alrkvd-r16 kivi2 --out $OUT/attention_table_final_h200.json 2>&1 | grep -v "no tuned" \
    > $OUT/attention_table_final.log
grep -E "alrkvd-rot-r16|paged|date" $OUT/attention_table_final.log
timeout 200 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 1,8 --contexts 32768 \
    --kv-formats fp16,alrkvd-rotated --modes graphs --steps 20 --out $OUT/engine_e2e_final_h200.json 2>&1 | tail -8
