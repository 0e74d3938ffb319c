# Device call 5 (from the repository root): the A/B of calls 3 and 4 gave `before` the values' codes row-major
# (compare_kernels did so for every `before` until this fix: right only for kernels older than 2026-12-03's head-major
# v_resid), so their `before` columns are slow. Again, in one run: the session's start (alrkvd_attention_before.py =
# git show 4fce1c5:kernels/alrkvd_attention.py) against the tree; rotated keys rank 16.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_one_warp_2026-12-03
timeout 100 python benchmarks/compare_kernels.py --out $OUT/final_ab.json --before $D/alrkvd_attention_before.py \
    --arms before now --shapes 8x32768 32x32768 1x4096 2>&1 | grep -v "no tuned" > $OUT/final_ab.log
tail -4 $OUT/final_ab.log
