# Device call 3 (from the repository root; the tree of this commit, whose kernel is c1cea8a's): issue 4's table with
# the kernel as it stands (scales one tile ahead, biased codes unpacked by inline PTX, the 2-warp launch capped at 168
# registers at rank <= 16); the engine's decode step at B=1 and 8, 32k; the device memory the first launches take;
# the grouped kernel's 4-warp launch capped at 168 registers (3 programs per SM). grouped.py: `git show
# c1cea8a:kernels/alrkvd_attention.py > grouped.py && git apply` head_groups_not_kept.patch to it.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_head_groups_2026-12-03
timeout 60 python benchmarks/results/alrkvd_pipeline_2026-12-03/local_memory.py 2>&1 | grep -v "no tuned"
timeout 220 python benchmarks/bench_attention.py --no-tune --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 \
    alrkvd-rot-mixed alrkvd-r16 --out $OUT/attention_table_final_h200.json 2>&1 | grep -v "no tuned" \
    > $OUT/attention_table_final.log
grep -E "alrkvd-rot-r16|sdpa|date" $OUT/attention_table_final.log
timeout 250 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 1,8 --contexts 32768 \
    --kv-formats fp16,alrkvd-rotated --modes graphs --steps 20 --out $OUT/engine_e2e_h200.json 2>&1 | tail -8
SHAPES=8x32768,32x32768,8x131072 timeout 200 python $D/probe_groups.py $OUT/probe_groups_caps_h200.json \
    kernels/alrkvd_attention.py $D/grouped.py before g4-n64-w4 g4-n64-w4-r168 2>&1 | grep -v "no tuned" | tail -5
