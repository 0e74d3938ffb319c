# Device call 4 (from the repository root): the tree as kept. The A/B against the kernel of the session's start
# (alrkvd_attention_before.py, from git show a4a7ef6:kernels/alrkvd_attention.py; compare_kernels gives it the values'
# codes row-major, as it reads them), rotated keys rank 16; then issue 4's table and the engine's decode step at 32k.
# (the snapshot is not kept in the repository: git show a4a7ef6:kernels/alrkvd_attention.py > $D/alrkvd_attention_before.py)
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_transposed_2026-12-03
timeout 120 python benchmarks/compare_kernels.py --out $OUT/final_ab.json --before $D/alrkvd_attention_before.py \
    --arms before now --shapes 8x32768 32x32768 8x131072 1x4096 2>&1 | grep -v "no tuned" > $OUT/final_ab.log
tail -6 $OUT/final_ab.log
timeout 150 python benchmarks/bench_attention.py --no-tune --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 \
    alrkvd-rot-mixed alrkvd-r16 kivi2 --out $OUT/attention_table_h200.json 2>&1 | grep -v "no tuned" \
    > $OUT/attention_table.log
grep -E "alrkvd-rot-r16|copy" $OUT/attention_table.log | head -12
timeout 220 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 1,8 --contexts 32768 \
    --kv-formats fp16,alrkvd-rotated --modes graphs --steps 20 --out $OUT/engine_e2e_h200.json 2>&1 | tail -8
