# Device call 5 (from the repository root): 2 warps against the launch's 4 where fewer than 64 (sequence, kv head)
# pairs run (B < 8 here), at lengths from 4k to 128k: call 3 saw 2 warps lose at B=1 L=4k and win at L=32k.
export PYTHONPATH=.
timeout 330 python benchmarks/compare_kernels.py --out $OUT/probe_warps.json --arms now w2:num_warps=2 \
    --shapes 1x4096 1x8192 1x16384 1x32768 1x131072 2x4096 2x16384 4x4096 4x8192 4x32768 2>&1 \
    | grep -v "no tuned" > $OUT/probe_warps.log
tail -12 $OUT/probe_warps.log
