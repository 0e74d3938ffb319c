# Device call 5 (from the repository root): (q B^T) * latent scale as two fp16 parts (high and low) in the low-rank
# key scores, for large queries (test_gqa_and_ranks at group 8 failed its budget with one fp16 rounding: 0.297 against
# 0.268); the kernel tests compiled (groups 1, 3, 4 and 8), then the A/B against the kernel of 0c5be4f
# (alrkvd_attention_4rows.py), rank 16 rotated keys.
# (the snapshot is not kept in the repository: git show 0c5be4f:kernels/alrkvd_attention.py > $D/alrkvd_attention_4rows.py)
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_query_rows_2026-12-03
timeout 100 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py 2>&1 | tail -2 | tee $OUT/kernel_tests_hilo.log
timeout 100 python benchmarks/compare_kernels.py --out $OUT/probe_hilo.json --before $D/alrkvd_attention_4rows.py \
    --arms before now --shapes 8x32768 32x32768 8x131072 1x4096 2>&1 | grep -v "no tuned" > $OUT/probe_hilo.log
tail -6 $OUT/probe_hilo.log
