# Device call 4 (from the repository root): the tree (the byte codes by one prmt per pair, _stream_rows, the next
# tile's stream scales loaded at the end of the tile) compiled under the kernel tests; the A/B against 5a4a50f
# (before); post_rope and rotated rank 64 at B=8 L=32k; then issue 4's table.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_byte_prmt_2026-12-03
timeout 110 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py 2>&1 | tail -2 | tee $OUT/kernel_tests.log
timeout 150 python benchmarks/compare_kernels.py --out $OUT/final_ab.json --before $D/alrkvd_attention_before.py \
    --arms before now --shapes 8x32768 32x32768 8x131072 1x4096 1x131072 8x4096 2>&1 | grep -v "no tuned" \
    > $OUT/final_ab.log
for v in alrkvd-r16 alrkvd-rot-r64; do
  timeout 70 python benchmarks/compare_kernels.py --out $OUT/final_ab_$v.json --before $D/alrkvd_attention_before.py \
      --arms before now --shapes 8x32768 --variant $v 2>&1 | grep -v "no tuned" > $OUT/final_ab_$v.log
done
timeout 170 python benchmarks/bench_attention.py --no-tune --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 \
    alrkvd-rot-mixed alrkvd-r16 kivi2 --out $OUT/attention_table_h200.json 2>&1 | grep -v "no tuned" \
    > $OUT/attention_table.log
tail -8 $OUT/final_ab.log; tail -1 $OUT/final_ab_alrkvd-r16.log; tail -1 $OUT/final_ab_alrkvd-rot-r64.log
grep -E "alrkvd-rot-r16|copy" $OUT/attention_table.log | head -12
