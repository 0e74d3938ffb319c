# Device call 1 (from the repository root): the kernel as it is against the ceiling probes of make_probes.py
# (no check: the probes' outputs are not attention), the copy bandwidth before and after.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_ceiling_2026-12-03
python $D/make_probes.py $OUT/probes
copy() { python -c "from benchmarks.devices import copy_bandwidth; print('copy GB/s %.0f' % (copy_bandwidth() / 1e9))"; }
copy > $OUT/copy.log
timeout 400 python benchmarks/compare_kernels.py --out $OUT/ceiling.json --check-tokens 0 \
    --arms now noblock@$OUT/probes/probe_noblock.py resid@$OUT/probes/probe_resid.py \
    --shapes 8x32768 8x131072 32x32768 1x131072 8x4096 2>&1 | grep -v "no tuned" > $OUT/ceiling.log
copy >> $OUT/copy.log
cat $OUT/copy.log; tail -8 $OUT/ceiling.log
