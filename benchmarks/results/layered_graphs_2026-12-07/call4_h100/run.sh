export PYTHONPATH=.
timeout 60 python .probe/reduce_probe.py > $OUT/reduce_probe.txt 2>&1; cat $OUT/reduce_probe.txt | cut -c1-400
timeout 60 python .probe/tiles_probe.py > $OUT/tiles_probe.txt 2>&1; cut -c1-600 $OUT/tiles_probe.txt
timeout 100 python -m pytest -q tests/engine/test_cuda_graphs.py -k "layered or long_histories" > $OUT/cuda_tests.txt 2>&1
tail -4 $OUT/cuda_tests.txt | cut -c1-300
mkdir -p $OUT/mix  # the engine alone under the same mix: ALR-KVD's layered steps and the commits after them
for arm in alrkvd-gpu:layered8 alrkvd-gpu; do
  name=${arm//:/_}
  timeout 100 python benchmarks/bench_step_mix.py --arms $arm --users 8,32 --steps 200 --warmup 30 \
     --out $OUT/mix/$name.json > $OUT/mix/$name.txt 2>&1
  echo "$name rc=$?"; grep "users" $OUT/mix/$name.txt | cut -c1-360; grep -i "error\|Traceback" $OUT/mix/$name.txt | tail -3
done
(cd $OUT && tar czf mix.tgz mix && rm -rf mix)
timeout 100 python benchmarks/profile_mixed_step.py --batch 0 --tokens 2048 --context 0 --graphs > $OUT/p2048_0.txt 2>&1; head -30 $OUT/p2048_0.txt | cut -c1-200
