# Device call 7 (from the repository root): call 6's table had post_rope and rank 64 slower than section 2o's run.
# In one run at B=8 L=32k: a70f2f4 (before), the tree (now, 72577c4), and the tree with the key residual's
# dots a tile ahead only for rotated keys (try_gated.py; post_rope's loop spills less so, CPU compile).
# The kernels come from make_kernels.sh.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_warp_split_2026-12-03
for v in alrkvd-r16 alrkvd-rot-r64; do
  timeout 100 python benchmarks/compare_kernels.py --out $OUT/ab5_$v.json --before $D/alrkvd_attention_before.py \
      --arms before now gated@$D/try_gated.py --shapes 8x32768 --variant $v 2>&1 | grep -v "no tuned" > $OUT/ab5_$v.log
  tail -2 $OUT/ab5_$v.log
done
