# Call 2 (session 50): the layered-graph CUDA tests (all of their output); served, one server after the other:
# ALR-KVD (alrkvd-gpu) with and without layered prefill in groups of 8 (windowed formats' layered steps eager), then
# fp16 with and without groups of 8 again (a second call of call 1's pair).
export PYTHONPATH=.
timeout 150 python -m pytest -q -x tests/engine/test_cuda_graphs.py -k "layered" > $OUT/cuda_tests.txt 2>&1
tail -25 $OUT/cuda_tests.txt | cut -c1-300
ms="qwen3_30b_alrkvd_layered8 qwen3_30b_alrkvd qwen3_30b_layered8 qwen3_30b"
mkdir -p $OUT/s
timeout 420 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "$ms" > $OUT/served_log.txt 2>&1
for m in $ms; do echo "== $m"; grep -A5 "^| users | requests" $OUT/s/$m/report.md; done
rm -f $OUT/s/*/*.png $OUT/s/*/locust* $OUT/s/*/requests.jsonl
(cd $OUT && tar czf s.tgz s && rm -rf s)
