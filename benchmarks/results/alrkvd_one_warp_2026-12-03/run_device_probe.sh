# Device call 1 (from the repository root): one warp per program with 64-token tiles (no cross-warp reductions or
# barriers in the loop; 1,740 SASS per 64 tokens against 2 warps' 1,711 per 128, CPU compile) against the launch
# as it stands (2 warps, 128-token tiles, from 64 pairs or a 16k table), with register caps and a deeper pipeline;
# rotated keys rank 16, then rank 64 and post_rope (whose 2-warp launch already takes 64-token tiles).
export PYTHONPATH=.
A="now w1:NUM_WARPS_MANY_PAIRS=1,BLOCK_N=64 w1r128:NUM_WARPS_MANY_PAIRS=1,BLOCK_N=64,maxnreg=128"
A="$A w1r168:NUM_WARPS_MANY_PAIRS=1,BLOCK_N=64,maxnreg=168 w1s3:NUM_WARPS_MANY_PAIRS=1,BLOCK_N=64,num_stages=3"
timeout 330 python benchmarks/compare_kernels.py --out $OUT/probe_rot.json --arms $A \
    --shapes 8x32768 32x32768 8x131072 8x4096 4x32768 1x131072 2>&1 | grep -v "no tuned" > $OUT/probe_rot.log
tail -9 $OUT/probe_rot.log
for v in alrkvd-r16 alrkvd-rot-r64; do
  timeout 80 python benchmarks/compare_kernels.py --out $OUT/probe_$v.json --variant $v \
      --arms now w1:NUM_WARPS_MANY_PAIRS=1 w1r128:NUM_WARPS_MANY_PAIRS=1,maxnreg=128 --shapes 8x32768 8x4096 \
      2>&1 | grep -v "no tuned" > $OUT/probe_$v.log
  tail -4 $OUT/probe_$v.log
done
grep -h "check_ok\|True\|False" $OUT/probe_*.log | grep -c True
grep -h "False\|Error" $OUT/probe_*.log | head -5
