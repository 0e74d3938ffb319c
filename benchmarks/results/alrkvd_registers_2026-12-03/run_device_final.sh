# Device call 3 (from the repository root): the tree (window tiles of 64 tokens in the 2-warp launch, 128 in the
# 4-warp one) against faa7d53 (before), with the 4-warp launch's window at 64 too (w4); the check against the
# reference runs at B * L <= 32768. Then post_rope and rotated rank 64 at B=8 L=32k, and issue 4's table.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_registers_2026-12-03
timeout 200 python benchmarks/compare_kernels.py --out $OUT/final_ab.json --before $D/alrkvd_attention_before.py \
    --arms before now w4:WINDOW_N=64 --shapes 8x32768 32x32768 8x131072 1x4096 4x4096 1x32768 1x131072 8x4096 \
    2>&1 | grep -v "no tuned" > $OUT/final_ab.log
for v in alrkvd-r16 alrkvd-rot-r64; do
  timeout 60 python benchmarks/compare_kernels.py --out $OUT/final_ab_$v.json --before $D/alrkvd_attention_before.py \
      --arms before now --shapes 8x32768 --variant $v 2>&1 | grep -v "no tuned" > $OUT/final_ab_$v.log
done
timeout 200 python benchmarks/bench_attention.py --no-tune --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 \
    alrkvd-rot-mixed alrkvd-r16 kivi2 --out $OUT/attention_table_h200.json 2>&1 | grep -v "no tuned" \
    > $OUT/attention_table.log
tail -10 $OUT/final_ab.log; tail -1 $OUT/final_ab_alrkvd-r16.log; tail -1 $OUT/final_ab_alrkvd-rot-r64.log
grep -E "alrkvd-rot-r16|copy" $OUT/attention_table.log | head -12
