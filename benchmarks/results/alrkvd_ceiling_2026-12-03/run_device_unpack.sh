# Device call 5 (from the repository root; the tree with the keys' codes head-major): the kernel as it is, the
# residuals-only probe and the unpack-and-multiply probe (make_probes.py); no check.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_ceiling_2026-12-03
python $D/make_probes.py $OUT/probes
P=$OUT/probes
timeout 300 python benchmarks/compare_kernels.py --out $OUT/unpack.json --check-tokens 0 \
    --arms now resid@$P/probe_resid.py unpack@$P/probe_unpack.py \
    --shapes 8x32768 8x131072 32x32768 1x131072 8x4096 2>&1 | grep -v "no tuned" > $OUT/unpack.log
rm -r $OUT/probes; tail -7 $OUT/unpack.log
