# Device call 3 (from the repository root, at aa7c67e: the format's keys' codes token-major, and compare_kernels.py's
# `+kh` arms copying them head-major; later trees store them head-major and have `+kt` arms instead): the keys'
# residual codes stored head-major (a head's tokens contiguous, 4 KB a tile, instead of 32 bytes every 256), for the
# kernel as it is and the residuals-only probe; first the check against the reference at B * L <= 32768.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_ceiling_2026-12-03
python $D/make_probes.py $OUT/probes
P=$OUT/probes
timeout 120 python benchmarks/compare_kernels.py --out $OUT/keys_check.json --arms now now+kh \
    --shapes 8x4096 1x4096 1x32768 2>&1 | grep -v "no tuned" > $OUT/keys_check.log
timeout 400 python benchmarks/compare_kernels.py --out $OUT/keys.json --check-tokens 0 \
    --arms now now+kh resid@$P/probe_resid.py resid+kh@$P/probe_resid.py \
    --shapes 8x32768 8x131072 32x32768 1x131072 8x4096 1x4096 2>&1 | grep -v "no tuned" > $OUT/keys.log
grep -E " 1 now" $OUT/keys_check.log; tail -8 $OUT/keys.log
