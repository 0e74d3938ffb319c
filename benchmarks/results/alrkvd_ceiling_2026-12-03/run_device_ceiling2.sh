# Device call 2 (from the repository root): the residuals-only probe under other launches (register caps of 168 and
# 128, 4 warps) against itself and the kernel as it is; no check.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_ceiling_2026-12-03
python $D/make_probes.py $OUT/probes
P=$OUT/probes
timeout 400 python benchmarks/compare_kernels.py --out $OUT/ceiling2.json --check-tokens 0 \
    --arms now resid@$P/probe_resid.py r168@$P/probe_resid_r168.py r128@$P/probe_resid_r128.py w4@$P/probe_resid_w4.py \
    --shapes 8x32768 8x131072 2>&1 | grep -v "no tuned" > $OUT/ceiling2.log
grep -E "^ +8 +[0-9]+ 1 " $OUT/ceiling2.log; tail -4 $OUT/ceiling2.log
