# Device call 3 (from the repository root): call 2's best (try_sums_late.py: the column sums over tokens as dots with
# the value dots' operands, their biases added after the value dots) against itself with shorter chains of dots:
# q B^T as two chains of 4 (try_qb2.py), the key residual's scores as two chains of 4 (try_sres2.py), both
# (try_chains2.py); the tree's kernel in the same run (rotated keys, rank 16).
# `now` was the tree at a70f2f4 when this ran; the try_*.py kernels come from make_kernels.sh.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_warp_split_2026-12-03
timeout 400 python benchmarks/compare_kernels.py --out $OUT/ab3.json --arms now sums_late@$D/try_sums_late.py \
    qb2@$D/try_qb2.py sres2@$D/try_sres2.py chains2@$D/try_chains2.py \
    --shapes 8x32768 32x32768 8x131072 1x4096 2>&1 | grep -v "no tuned" > $OUT/ab3.log
tail -7 $OUT/ab3.log
