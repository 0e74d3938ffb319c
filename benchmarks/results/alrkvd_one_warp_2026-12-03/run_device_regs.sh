# Device call 3 (from the repository root): the profile of call 2 found the loop latency-bound (1.9 warps per
# scheduler, 0.5 eligible; 255 registers, 4 programs per SM), 10% of its stall samples waiting on global loads (the
# next block's id, its ranks, then its scales: a chain issued and used within one iteration) and 16% on shuffles and
# shared memory (column sums over tokens). The tree: the block id loaded two tiles ahead and the next tile's stream
# scales issued mid-iteration ("prefetch"), and three column sums in one reduction, the softmax's taken from the
# fp16 weights. Against the kernel before both (before = git show 4fce1c5:kernels/alrkvd_attention.py) and with the
# prefetch alone (alrkvd_attention_prefetch.py; neither file kept in the repository); then register caps between the
# 168 that spilled (6 programs per SM, slower: section 2n) and none: 200 (5 programs per SM) and 184; and a third
# pipeline stage (4 programs still fit); rotated keys rank 16, then post_rope and rank 64 at B=8 L=32k. The kernel
# tests compiled first.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_one_warp_2026-12-03
timeout 150 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py 2>&1 | tail -2 | tee $OUT/kernel_tests_ahead.log
timeout 300 python benchmarks/compare_kernels.py --out $OUT/probe_regs.json --before $D/alrkvd_attention_before.py \
    --arms before now r200:maxnreg=200 r184:maxnreg=184 s3:num_stages=3 \
    --shapes 8x32768 32x32768 8x131072 8x4096 1x131072 1x4096 2>&1 | grep -v "no tuned" > $OUT/probe_regs.log
tail -8 $OUT/probe_regs.log
timeout 120 python benchmarks/compare_kernels.py --out $OUT/probe_sums.json --before $D/alrkvd_attention_prefetch.py \
    --arms before now --shapes 8x32768 32x32768 8x131072 1x4096 2>&1 | grep -v "no tuned" > $OUT/probe_sums.log
tail -6 $OUT/probe_sums.log
for v in alrkvd-r16 alrkvd-rot-r64; do
  timeout 60 python benchmarks/compare_kernels.py --out $OUT/probe_regs_$v.json --variant $v \
      --before $D/alrkvd_attention_before.py --arms before now --shapes 8x32768 2>&1 | grep -v "no tuned" \
      > $OUT/probe_regs_$v.log
  tail -2 $OUT/probe_regs_$v.log
done
grep -h "^  8   32768 1" $OUT/probe_regs*.log | cut -c1-160
