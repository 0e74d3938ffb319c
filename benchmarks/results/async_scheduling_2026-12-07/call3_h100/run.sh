# Issue 33, the served async tail: is it the metrics thread? fp16 with async_scheduling without any metric work
# (MetricsLogger._safely returns), with a trace of each thread's part (trace_probe.py), as is, and step by step.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
mkdir -p $OUT/s
rm -f /tmp/alrkvd_trace.jsonl
ARMS="qwen3_30b_async_nometrics qwen3_30b_async_trace qwen3_30b_async qwen3_30b"
for m in $ARMS; do
  timeout 170 bash loadtest/gpu_serving.sh $OUT/s 8,32 20s "$m" > $OUT/served_$m.log 2>&1; echo "== served $m rc=$? $(( $(date +%s) - t0 ))s"
  [ -f /tmp/alrkvd_trace.jsonl ] && gzip -c /tmp/alrkvd_trace.jsonl > $OUT/trace.jsonl.gz && rm /tmp/alrkvd_trace.jsonl
done
for m in $ARMS; do echo "== $m"; grep -A4 "^| users | requests" $OUT/s/$m/report.md; done
python benchmarks/results/async_scheduling_2026-12-07/gaps.py $OUT/s/*/requests.jsonl* 2>&1 | cut -c1-250
rm -f $OUT/s/*/*.png; (cd $OUT && tar czf s.tgz s && rm -rf s)
