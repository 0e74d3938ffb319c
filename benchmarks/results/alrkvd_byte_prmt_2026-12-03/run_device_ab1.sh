# Device call 1 (from the repository root): the tree (the byte codes by one prmt per pair, the softmax scale on
# vectors, the codes' bias starting the residual dots) against 5a4a50f (before), the byte change alone (prmt), and
# the tree with the key residual's dots ahead guarded by t + 1 < t_end (guard). Kernel tests compiled first.
# As run, the tree was try_fold.py and try_guard.py was today's try_fold_guard.py; both lost and are kept as
# patches (make_kernels.sh writes them). To re-run: --arms before prmt@$D/try_prmt.py fold@$D/try_fold.py
# fold_guard@$D/try_fold_guard.py.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_byte_prmt_2026-12-03
timeout 110 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py 2>&1 | tail -2 | tee $OUT/kernel_tests.log
timeout 260 python benchmarks/compare_kernels.py --out $OUT/ab1.json --before $D/alrkvd_attention_before.py \
    --arms before prmt@$D/try_prmt.py now guard@$D/try_guard.py \
    --shapes 8x32768 32x32768 8x131072 1x4096 1x131072 8x4096 2>&1 | grep -v "no tuned" > $OUT/ab1.log
for v in alrkvd-r16 alrkvd-rot-r64; do
  timeout 90 python benchmarks/compare_kernels.py --out $OUT/ab1_$v.json --before $D/alrkvd_attention_before.py \
      --arms before now --shapes 8x32768 --variant $v 2>&1 | grep -v "no tuned" > $OUT/ab1_$v.log
done
tail -9 $OUT/ab1.log; tail -2 $OUT/ab1_alrkvd-r16.log; tail -2 $OUT/ab1_alrkvd-rot-r64.log
