# Device call 5 (from the repository root): the key residual's dots a tile ahead (try_kres_ahead.py: the codes of tile
# t+1 times the query at the end of tile t, so that their chain of dots overlaps tile t's values; the per-token scales
# applied in tile t+1 as before), and that with q B^T as two chains of 4 dots (try_kres_qb2.py) against the tree
# (16b8c7a) and a70f2f4, in one run (rotated keys, rank 16).
# `now` was the tree at 16b8c7a when this ran; the kernels come from make_kernels.sh.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_warp_split_2026-12-03
timeout 300 python benchmarks/compare_kernels.py --out $OUT/ab4.json --before $D/alrkvd_attention_before.py \
    --arms before now kres_ahead@$D/try_kres_ahead.py kres_qb2@$D/try_kres_qb2.py \
    --shapes 8x32768 32x32768 8x131072 8x4096 1x4096 1x131072 2>&1 \
    | grep -v "no tuned" > $OUT/ab4.log
tail -8 $OUT/ab4.log
