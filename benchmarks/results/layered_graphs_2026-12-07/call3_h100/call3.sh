# Call 3 (session 50): the layered-graph CUDA tests (collection fixed); fp16 served with and without layered
# prefill in groups of 8, a third pair (calls 1 and 2 gave 8-user tails of 1.50 / 2.05x against 2.30 / 2.35x).
export PYTHONPATH=.
timeout 150 python -m pytest -q -x tests/engine/test_cuda_graphs.py -k "layered" > $OUT/cuda_tests.txt 2>&1
tail -4 $OUT/cuda_tests.txt | cut -c1-300
ms="qwen3_30b_layered8 qwen3_30b"
mkdir -p $OUT/s
timeout 300 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "$ms" > $OUT/served_log.txt 2>&1
for m in $ms; do echo "== $m"; grep -A5 "^| users | requests" $OUT/s/$m/report.md; done
rm -f $OUT/s/*/*.png $OUT/s/*/locust* $OUT/s/*/requests.jsonl
(cd $OUT && tar czf s.tgz s && rm -rf s)
