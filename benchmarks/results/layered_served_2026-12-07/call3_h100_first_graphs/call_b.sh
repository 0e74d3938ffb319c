# Layered groups as CUDA graphs: the test on CUDA, then the engine mix (fp16 against layered 8, 4, 3, 2).
export PYTHONPATH=.
start=$(date +%s)
timeout 150 python -m pytest -q -x tests/engine/test_cuda_graphs.py -k "layered or mixed_steps or greedy" 2>&1 | tail -4 | tee $OUT/cuda_tests.txt
mkdir -p $OUT/mix
for arm in fp16:layered8 fp16:layered4 fp16 fp16:layered3 fp16:layered2; do
  if [ $(( $(date +%s) - start )) -gt 430 ]; then echo "skip $arm (time)"; continue; fi
  name=${arm//:/_}
  timeout 120 python benchmarks/bench_step_mix.py --arms $arm --users 8,32 --steps 200 --warmup 30 \
     --out $OUT/mix/$name.json > $OUT/mix/$name.txt 2>&1
  echo "$name rc=$?"; grep "users" $OUT/mix/$name.txt | cut -c1-360
done
cd $OUT && tar czf mix.tgz mix && rm -rf mix
