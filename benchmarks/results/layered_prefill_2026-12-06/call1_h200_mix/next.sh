# Device call: layered prefill on CUDA. 1) smoke/equality on a small MoE; 2) the GPU load test's mix in the engine.
export PYTHONPATH=.
start=$(date +%s)
mkdir -p $OUT/mix
timeout 150 python .probe/layered_eq.py 2>&1 | tail -40 | tee $OUT/eq.txt
for arm in fp16 fp16:layered4 alrkvd-gpu:layered4 alrkvd-gpu fp16:layered8; do
  if [ $(( $(date +%s) - start )) -gt 440 ]; then echo "skip $arm (time)"; continue; fi
  name=${arm//:/_}
  timeout 130 python benchmarks/bench_step_mix.py --arms $arm --users 8,32 --steps 200 --warmup 30 \
    --out $OUT/mix/$name.json > $OUT/mix/$name.txt 2>&1
  echo "$arm rc=$?"; grep -v "^ " $OUT/mix/$name.txt | tail -3 | cut -c1-400
done
cd $OUT && tar czf mix.tgz mix && rm -rf mix
