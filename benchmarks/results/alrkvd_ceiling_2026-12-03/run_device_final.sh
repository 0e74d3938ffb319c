# Device call 4 (from the repository root), the tree with the keys' residual codes head-major: the kernel tests and
# the compression tests compiled on the H200, issue 4's table, and the engine's decode step at B=8 L=32k (fp16
# against rotated ALR-KVD, CUDA graphs; the cache's compression writes the new layout).
export PYTHONPATH=.
timeout 240 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py tests/test_kernels_alrkvd_compress.py \
    > $OUT/tests.log 2>&1
timeout 200 python benchmarks/bench_attention.py --no-tune --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 \
    alrkvd-rot-mixed alrkvd-r16 kivi2 --out $OUT/attention_table_h200.json 2>&1 | grep -v "no tuned" \
    > $OUT/attention_table.log
timeout 200 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 8 --contexts 32768 \
    --kv-formats fp16,alrkvd-rotated --modes graphs --steps 20 --out $OUT/engine_e2e_h200.json > $OUT/engine.log 2>&1
tail -1 $OUT/tests.log; grep -E "alrkvd-rot-r16|copy" $OUT/attention_table.log | head -12; tail -4 $OUT/engine.log
