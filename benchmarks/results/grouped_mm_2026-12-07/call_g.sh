# Session 51, the one call left: the grouped-GEMM MoE probe and its engine A/B at a 2,048-token chunk; its tests.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python .probe/grouped_mm_probe.py > $OUT/grouped_mm.txt 2>&1; tail -7 $OUT/grouped_mm.txt | cut -c1-200
mkdir -p $OUT/prof
for g in 0 64; do
  f=$OUT/prof/p2048_g$g
  timeout 70 python benchmarks/profile_mixed_step.py --batch 0 --tokens 2048 --context 0 --graphs --grouped-mm $g \
    --out $f.json > $f.txt 2>&1
  echo "grouped_mm=$g rc=$?"; head -9 $f.txt | cut -c1-160
done
timeout 60 python -m pytest -q -x tests/kernels/test_fused_moe.py -k "grouped or shapes" > $OUT/cuda_tests.txt 2>&1
tail -2 $OUT/cuda_tests.txt | cut -c1-300
