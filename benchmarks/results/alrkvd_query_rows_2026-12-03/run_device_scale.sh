# Device call 4 (from the repository root): the softmax scale folded into qb and the per-token scales, and the
# softmax's row sum reused for the latents' zero (2,101 -> 2,058 instructions per tile, CPU compile) against the kernel
# of 0c5be4f (alrkvd_attention_4rows.py, `git show 0c5be4f:kernels/alrkvd_attention.py`); then the compression
# kernel's registers on the H200 (benchmarks/results/alrkvd_compress_regs_2026-12-03/).
# (the snapshot is not kept in the repository: git show 0c5be4f:kernels/alrkvd_attention.py > $D/alrkvd_attention_4rows.py)
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_query_rows_2026-12-03
for v in alrkvd-rot-r16 alrkvd-r16; do
  timeout 100 python benchmarks/compare_kernels.py --out $OUT/probe_scale_$v.json --variant $v \
      --before $D/alrkvd_attention_4rows.py --arms before now --shapes 8x32768 32x32768 8x131072 1x4096 8x4096 \
      2>&1 | grep -v "no tuned" > $OUT/probe_scale_$v.log
  tail -6 $OUT/probe_scale_$v.log
done
bash benchmarks/results/alrkvd_compress_regs_2026-12-03/run_device_probe.sh
