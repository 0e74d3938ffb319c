# Device call 6 (from the repository root): the tree with calls 2-5's changes (the column sums over tokens as dots of
# the value dots' operands, their biases added after those dots; ps from the fp16 weights; the key residual's dots a
# tile ahead; q B^T as two chains). The kernel tests compiled;
# the A/B against the kernel before it (alrkvd_attention_before.py = git show a70f2f4:kernels/alrkvd_attention.py,
# not kept in the repository), rotated keys rank 16; then issue 4's table.
# alrkvd_attention_before.py comes from make_kernels.sh.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_warp_split_2026-12-03
timeout 110 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py 2>&1 | tail -2 | tee $OUT/kernel_tests.log
timeout 120 python benchmarks/compare_kernels.py --out $OUT/final_ab.json --before $D/alrkvd_attention_before.py \
    --arms before now --shapes 8x32768 32x32768 8x131072 8x4096 1x4096 1x131072 2>&1 | grep -v "no tuned" \
    > $OUT/final_ab.log
timeout 150 python benchmarks/bench_attention.py --no-tune --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 \
    alrkvd-rot-mixed alrkvd-r16 kivi2 --out $OUT/attention_table_h200.json 2>&1 | grep -v "no tuned" \
    > $OUT/attention_table.log
tail -8 $OUT/final_ab.log
grep -E "alrkvd-rot-r16|copy" $OUT/attention_table.log | head -12
