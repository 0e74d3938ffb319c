# One call: qk_norm_rope old/new; the engine mix (fp16, layered 2, 3, 8; GEMM rows padded and warmed); profiles.
export PYTHONPATH=.
start=$(date +%s)
timeout 90 python .probe/qk_probe.py 2>&1 | tail -6 | tee $OUT/qk_probe.txt
mkdir -p $OUT/mix
for arm in fp16:layered3 fp16 fp16:layered2 fp16:layered8; do
  if [ $(( $(date +%s) - start )) -gt 400 ]; then echo "skip $arm (time)"; continue; fi
  name=${arm//:/_}
  timeout 120 python benchmarks/bench_step_mix.py --arms $arm --users 8,32 --steps 200 --warmup 30 \
     --out $OUT/mix/$name.json > $OUT/mix/$name.txt 2>&1
  echo "$name rc=$?"; grep "users" $OUT/mix/$name.txt | cut -c1-360
done
for spec in "p2048_0:--batch 0 --tokens 2048 --context 0 --graphs" "decode_b1:--decode --batch 1 --context 4096"; do
  if [ $(( $(date +%s) - start )) -gt 480 ]; then echo "skip $spec (time)"; continue; fi
  name=${spec%%:*}; args=${spec#*:}
  timeout 100 python benchmarks/profile_mixed_step.py $args --out $OUT/$name.json > $OUT/$name.txt 2>&1
  echo "== $name rc=$?"; grep -v "no tuned" $OUT/$name.txt | head -22 | cut -c1-150
done
cd $OUT && tar czf mix.tgz mix && rm -rf mix
