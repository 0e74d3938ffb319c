# Device call 2 (from the repository root): the tree's kernel against candidates that take work off the chain from a
# tile's keys to its values, in one run (rotated keys, rank 16): ps from the fp16 weights (try_ps.py, call 1's); its
# column-sum biases added after the value dots instead of into their accumulators (try_late.py); call 1's try_sums.py
# so (try_sums_late.py); q B^T for the next tile computed a tile ahead, its basis codes loaded mid-iteration and the
# dot there (try_qb_ahead.py) or at the iteration's end (try_qb_end.py).
# `now` was the tree at a70f2f4 when this ran; the try_*.py kernels come from make_kernels.sh.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_warp_split_2026-12-03
timeout 400 python benchmarks/compare_kernels.py --out $OUT/ab2.json --arms now ps@$D/try_ps.py late@$D/try_late.py \
    sums_late@$D/try_sums_late.py qb_ahead@$D/try_qb_ahead.py qb_end@$D/try_qb_end.py \
    --shapes 8x32768 32x32768 1x4096 2>&1 | grep -v "no tuned" > $OUT/ab2.log
tail -6 $OUT/ab2.log
