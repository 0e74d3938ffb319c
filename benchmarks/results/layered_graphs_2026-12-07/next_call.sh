# Run in session 52 (journal 2026-12-07 35b) in three calls: call4_h100 (tests, mix), call5_h100 and call6_h100 (served).
# The next call (not run: session 50's device time ran out; session 51 got one machine for 131 s, whose engine mix
# found ALR-KVD's layered graphs asserting at capture, fixed in 2c66be3, journal 34b).
# ALR-KVD's layered steps as graphs (journal 2026-12-07 33b): the CUDA tests; the engine mix, ALR-KVD with groups
# of 8 against without (an arm a process); then served, one server after the other: ALR-KVD with groups of 8,
# ALR-KVD without, and the default `fp16` model (groups of 8 since 33a). Prepare here:
#   python -m server.dummy_repository --out reports/gpu_repository
#   python -m server.dummy_repository --out reports/gpu_repository --name qwen3_30b_alrkvd --kv-format alrkvd-gpu
#   python -m server.dummy_repository --out reports/gpu_repository --name qwen3_30b_alrkvd_layered8 \
#     --kv-format alrkvd-gpu --layered-prefill 8
#   rm -rf reports/gpu_repository/*_eager
# carry .device and reports/gpu_repository; run: source .device/setup.sh && bash THIS.
export PYTHONPATH=.
timeout 100 python -m pytest -q -x tests/engine/test_cuda_graphs.py -k "layered or long_histories" > $OUT/cuda_tests.txt 2>&1
tail -4 $OUT/cuda_tests.txt | cut -c1-300
mkdir -p $OUT/mix  # the engine alone under the same mix: ALR-KVD's layered steps and the commits after them
for arm in alrkvd-gpu:layered8 alrkvd-gpu; do
  name=${arm//:/_}
  timeout 100 python benchmarks/bench_step_mix.py --arms $arm --users 8,32 --steps 200 --warmup 30 \
     --out $OUT/mix/$name.json > $OUT/mix/$name.txt 2>&1
  echo "$name rc=$?"; grep "users" $OUT/mix/$name.txt | cut -c1-360; grep -i "error\|Traceback" $OUT/mix/$name.txt | tail -3
done
(cd $OUT && tar czf mix.tgz mix && rm -rf mix)
ms="qwen3_30b_alrkvd_layered8 qwen3_30b_alrkvd qwen3_30b"
mkdir -p $OUT/s
timeout 300 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "$ms" > $OUT/served_log.txt 2>&1
for m in $ms; do echo "== $m"; grep -A5 "^| users | requests" $OUT/s/$m/report.md; done
grep -i "error\|Traceback" $OUT/s/server_*.log | head -5 | cut -c1-300
rm -f $OUT/s/*/*.png $OUT/s/*/locust* $OUT/s/*/requests.jsonl
(cd $OUT && tar czf s.tgz s && rm -rf s)
