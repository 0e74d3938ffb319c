# The next call (not run: session 50's device time ran out). ALR-KVD's layered steps as graphs (journal 2026-12-07
# 33b): the CUDA tests; then served, one server after the other: ALR-KVD with groups of 8, ALR-KVD without, and the
# default `fp16` model (groups of 8 since 33a). Prepare here:
#   python -m server.dummy_repository --out reports/gpu_repository
#   python -m server.dummy_repository --out reports/gpu_repository --name qwen3_30b_alrkvd --kv-format alrkvd-gpu
#   python -m server.dummy_repository --out reports/gpu_repository --name qwen3_30b_alrkvd_layered8 \
#     --kv-format alrkvd-gpu --layered-prefill 8
#   rm -rf reports/gpu_repository/*_eager
# carry .device and reports/gpu_repository; run: source .device/setup.sh && bash THIS.
export PYTHONPATH=.
timeout 100 python -m pytest -q -x tests/engine/test_cuda_graphs.py -k "layered or long_histories" > $OUT/cuda_tests.txt 2>&1
tail -4 $OUT/cuda_tests.txt | cut -c1-300
ms="qwen3_30b_alrkvd_layered8 qwen3_30b_alrkvd qwen3_30b"
mkdir -p $OUT/s
timeout 380 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "$ms" > $OUT/served_log.txt 2>&1
for m in $ms; do echo "== $m"; grep -A5 "^| users | requests" $OUT/s/$m/report.md; done
grep -i "error\|Traceback" $OUT/s/server_*.log | head -5 | cut -c1-300
rm -f $OUT/s/*/*.png $OUT/s/*/locust* $OUT/s/*/requests.jsonl
(cd $OUT && tar czf s.tgz s && rm -rf s)
