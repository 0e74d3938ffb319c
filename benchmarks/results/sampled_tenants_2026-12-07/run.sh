# H200: issue 33's served figures, both caches, every default. Otherwise (H100): async_scheduling's timeline, then
# fp16 served with sampled tenants against greedy ones.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/s
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout 560 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "qwen3_30b_alrkvd qwen3_30b" > $OUT/served.log 2>&1
  echo "== served rc=$?"
  for m in qwen3_30b_alrkvd qwen3_30b; do echo "== $m"; grep -A5 "^| users | requests" $OUT/s/$m/report.md; done
else
  timeout 200 python benchmarks/results/async_scheduling_2026-12-07/timeline_h100/async_timeline.py $OUT > $OUT/timeline.txt 2>&1; echo "== timeline rc=$?"
  grep -v "no tuned" $OUT/timeline.txt | tail -6
  mkdir -p $OUT/s/sampled
  timeout 170 bash loadtest/gpu_serving.sh $OUT/s/sampled 1,8,32 20s "qwen3_30b" benchmarks/results/sampled_tenants_2026-12-07/tenants_sampled.yaml > $OUT/served_sampled.log 2>&1
  echo "== sampled rc=$?"; grep -A5 "^| users | requests" $OUT/s/sampled/qwen3_30b/report.md
  timeout 170 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "qwen3_30b" > $OUT/served.log 2>&1
  echo "== greedy rc=$?"; grep -A5 "^| users | requests" $OUT/s/qwen3_30b/report.md
fi
rm -f $OUT/s/*/*.png $OUT/s/*/*/*.png; (cd $OUT && tar czf s.tgz s *.log && rm -rf s)
