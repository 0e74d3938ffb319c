# The next call (not run: session 49's device time ran out). Layered steps as CUDA graphs (journal 2026-12-07 32b):
# the test on CUDA; the engine mix, layered groups of 4 and 8 against fp16 (an arm a process); then served, layered 4
# and 8 against fp16, one server after the other (layering now only beside up to 10 decodes: at 32 users mostly
# plain mixed steps). Prepare here: python -m server.dummy_repository --out reports/gpu_repository --name
# qwen3_30b_layered4 --kv-format fp16 --layered-prefill 4 (the same for 8, and the default qwen3_30b), rm -rf
# reports/gpu_repository/*_eager; carry .device and reports/gpu_repository; run: source .device/setup.sh && bash THIS.
export PYTHONPATH=.
start=$(date +%s)
timeout 120 python -m pytest -q -x tests/engine/test_cuda_graphs.py -k "layered" 2>&1 | tail -3 | tee $OUT/cuda_tests.txt
mkdir -p $OUT/mix
for arm in fp16:layered4 fp16:layered8 fp16; do
  if [ $(( $(date +%s) - start )) -gt 150 ]; then echo "skip $arm (time)"; continue; fi
  name=${arm//:/_}
  timeout 100 python .probe/compile_log.py benchmarks/bench_step_mix.py --arms $arm --users 8,32 --steps 200 --warmup 30 \
     --out $OUT/mix/$name.json > $OUT/mix/$name.txt 2>&1
  echo "$name rc=$?"; grep "users" $OUT/mix/$name.txt | cut -c1-360; grep -i "error\|Traceback" $OUT/mix/$name.txt | tail -3; echo "compiles: $(grep -c "^\[compile " $OUT/mix/$name.txt), last:"; grep "^\[compile " $OUT/mix/$name.txt | tail -2 | cut -c1-200
done
(cd $OUT && tar czf mix.tgz mix && rm -rf mix)
if [ $(( $(date +%s) - start )) -lt 230 ]; then
  mkdir -p $OUT/s
  timeout 380 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "qwen3_30b_layered4 qwen3_30b_layered8 qwen3_30b" \
    > $OUT/served_log.txt 2>&1
  for m in qwen3_30b_layered4 qwen3_30b_layered8 qwen3_30b; do echo "== $m"; grep -A5 "^| users | requests" $OUT/s/$m/report.md; done
  rm -f $OUT/s/*/*.png $OUT/s/*/locust* $OUT/s/*/requests.jsonl
  (cd $OUT && tar czf s.tgz s && rm -rf s)
fi
