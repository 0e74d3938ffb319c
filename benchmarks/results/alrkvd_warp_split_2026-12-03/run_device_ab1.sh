# Device call 1 (from the repository root): the tree's kernel against candidates, in one run (rotated keys, rank 16):
# ps from the fp16 weights (try_ps.py); + q B^T split across the two warps (try_qb.py); + the latent values' dot split
# across the two warps (try_plat.py); ps + the column sums over tokens as dots with the value dots' operands
# (try_sums.py); that + q B^T split (try_sums_qb.py).
# `now` was the tree at a70f2f4 when this ran; the try_*.py kernels come from make_kernels.sh.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_warp_split_2026-12-03
timeout 400 python benchmarks/compare_kernels.py --out $OUT/ab1.json --arms now ps@$D/try_ps.py qb@$D/try_qb.py \
    plat@$D/try_plat.py sums@$D/try_sums.py sums_qb@$D/try_sums_qb.py --shapes 8x32768 32x32768 1x4096 2>&1 \
    | grep -v "no tuned" > $OUT/ab1.log
tail -6 $OUT/ab1.log
