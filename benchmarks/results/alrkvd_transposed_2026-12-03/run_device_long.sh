# Device call 6 (from the repository root): the 2-warp launch also where the block table spans >= 16k tokens
# (LONG_TOKENS) though fewer than 64 pairs run, against the rule before it (old: LONG_TOKENS out of reach), for
# rotated keys rank 16, post_rope rank 16 and rotated rank 64 (whose 2-warp launch takes 64-token tiles).
export PYTHONPATH=.
timeout 100 python benchmarks/compare_kernels.py --out $OUT/probe_long_rot.json --arms now old:LONG_TOKENS=1000000000 \
    --shapes 1x4096 1x16384 1x32768 1x131072 4x32768 2>&1 | grep -v "no tuned" > $OUT/probe_long_rot.log
for v in alrkvd-r16 alrkvd-rot-r64; do
  timeout 80 python benchmarks/compare_kernels.py --out $OUT/probe_long_$v.json --variant $v \
      --arms now old:LONG_TOKENS=1000000000 --shapes 1x16384 1x32768 1x131072 2>&1 | grep -v "no tuned" \
      > $OUT/probe_long_$v.log
done
for f in rot alrkvd-r16 alrkvd-rot-r64; do tail -7 $OUT/probe_long_$f.log; done
