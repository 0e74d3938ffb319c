# Device call 1 (from the repository root): the tree (the window's tiles of 32 tokens, WINDOW_N, so that the window
# branch no longer spills) under the kernel tests compiled, then in one run against faa7d53 (before): the tree (now),
# the tree under register caps that let more programs share an SM (maxnreg 200: 5 two-warp programs, 168: 6), and
# try_subtiles.py (the per-block work, q B^T and the values' up-projection, done once a block, with 64-token tiles
# at 168 registers). Rotated keys, rank 16. Then B=8 L=32k at rank 64 and post_rope, before against now and r200.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_registers_2026-12-03
timeout 110 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py 2>&1 | tail -2 | tee $OUT/kernel_tests.log
timeout 330 python benchmarks/compare_kernels.py --out $OUT/ab1.json --before $D/alrkvd_attention_before.py \
    --arms before now r200:maxnreg=200 r168:maxnreg=168 sub@$D/try_subtiles.py \
    --shapes 8x32768 32x32768 8x131072 1x4096 1x131072 8x4096 2>&1 | grep -v "no tuned" > $OUT/ab1.log
for v in alrkvd-r16 alrkvd-rot-r64; do
  timeout 70 python benchmarks/compare_kernels.py --out $OUT/ab1_$v.json --before $D/alrkvd_attention_before.py \
      --arms before now r200:maxnreg=200 --shapes 8x32768 --variant $v 2>&1 | grep -v "no tuned" > $OUT/ab1_$v.log
done
tail -9 $OUT/ab1.log; tail -3 $OUT/ab1_alrkvd-r16.log; tail -3 $OUT/ab1_alrkvd-rot-r64.log
