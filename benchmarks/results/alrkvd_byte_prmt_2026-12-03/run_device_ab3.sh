# Device call 3 (from the repository root): the tree (the byte codes by one prmt per pair; _stream_rows) compiled
# under the kernel tests, then in one run against 5a4a50f (before): the byte change alone (prmt, without
# _stream_rows), the tree (now), the tree with the key residual's dots ahead guarded by t + 1 < t_end (guard), the
# tree with the next tile's stream scales loaded at the end of the tile instead of mid-tile (late). Then post_rope
# and rotated rank 64 at B=8 L=32k, before against now. The kernel files come from make_kernels.sh.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_byte_prmt_2026-12-03
timeout 110 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py 2>&1 | tail -2 | tee $OUT/kernel_tests.log
timeout 260 python benchmarks/compare_kernels.py --out $OUT/ab3.json --before $D/alrkvd_attention_before.py \
    --arms before prmt@$D/try_prmt.py now guard@$D/try_guard.py late@$D/try_late.py \
    --shapes 8x32768 32x32768 8x131072 1x4096 1x131072 8x4096 2>&1 | grep -v "no tuned" > $OUT/ab3.log
for v in alrkvd-r16 alrkvd-rot-r64; do
  timeout 90 python benchmarks/compare_kernels.py --out $OUT/ab3_$v.json --before $D/alrkvd_attention_before.py \
      --arms before now --shapes 8x32768 --variant $v 2>&1 | grep -v "no tuned" > $OUT/ab3_$v.log
done
tail -9 $OUT/ab3.log; tail -2 $OUT/ab3_alrkvd-r16.log; tail -2 $OUT/ab3_alrkvd-rot-r64.log
