# Device call 1 (from the repository root): the kernels compiled with the query group padded to a power of two
# (M = 4 rows in every tl.dot of a group of 4) instead of 16. First the kernel tests compiled on the GPU (GQA 1, 3
# and 4: dots of 1 and 4 rows), then the A/B probe, rank 16 rotated keys (before = the kernel of 96677b2 with its
# padding to 16: alrkvd_attention_before.py is `git show 96677b2:kernels/alrkvd_attention.py` with BLOCK_G =
# max(16, next_power_of_2(group)) written out, since it imports the padding from kernels/paged_attention.py),
# then issue 4's table and the engine's decode step at 32k. The snapshot is not kept in the repository; before a rerun:
#   git show 96677b2:kernels/alrkvd_attention.py | sed 's/BLOCK_G=_group_block(group)/BLOCK_G=max(16, triton.next_power_of_2(group))/' > $D/alrkvd_attention_before.py
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_query_rows_2026-12-03
timeout 110 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py tests/test_kernels_paged_attention.py \
    tests/test_kernels_kivi_attention.py 2>&1 | tail -3 | tee $OUT/kernel_tests.log
timeout 200 python benchmarks/compare_kernels.py --out $OUT/probe_rows_h200.json --before $D/alrkvd_attention_before.py \
    --arms before now n64:BLOCK_N=64 r168:maxnreg=168 w4r160:NUM_WARPS_MANY_PAIRS=4,maxnreg=160 2>&1 \
    | grep -v "no tuned" > $OUT/probe_rows.log
tail -8 $OUT/probe_rows.log
timeout 120 python benchmarks/bench_attention.py --no-tune --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 \
    alrkvd-rot-mixed alrkvd-r16 kivi2 --out $OUT/attention_table_h200.json 2>&1 | grep -v "no tuned" \
    > $OUT/attention_table.log
grep -E "alrkvd-rot-r16|date" $OUT/attention_table.log
timeout 150 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 1,8 --contexts 32768 \
    --kv-formats fp16,alrkvd-rotated --modes graphs --steps 20 --out $OUT/engine_e2e_h200.json 2>&1 | tail -8
