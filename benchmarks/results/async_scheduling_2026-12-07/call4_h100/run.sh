# Issue 33: meant to time the metrics thread reading the routing counts on a stream of its own; that edit had not
# applied (AsyncEngine.read_stream missing), so in every arm but _oldread the metrics refresh failed at the routing
# read (AttributeError in the server log): those arms ran with no routing read and no imbalance gauges, _oldread
# (reports/gpu_repository copy with oldread.patch) with the read as before, on the engine's stream. Served fp16 and
# ALR-KVD, queued steps against step by step (journal 2026-12-07 42a).
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
mkdir -p $OUT/s
for spec in "qwen3_30b_async 1,8,32" "qwen3_30b 1,8,32" "qwen3_30b_async_oldread 32" "qwen3_30b_alrkvd_async 1,8,32" "qwen3_30b_alrkvd 1,8,32"; do
  set -- $spec
  timeout 170 bash loadtest/gpu_serving.sh $OUT/s $2 20s "$1" > $OUT/served_$1.log 2>&1; echo "== served $1 rc=$? $(( $(date +%s) - t0 ))s"
done
for m in qwen3_30b_async qwen3_30b qwen3_30b_async_oldread qwen3_30b_alrkvd_async qwen3_30b_alrkvd; do echo "== $m"; grep -A5 "^| users | requests" $OUT/s/$m/report.md | cut -c1-140; done
python benchmarks/results/async_scheduling_2026-12-07/gaps.py $OUT/s/*/requests.jsonl* 2>&1 | cut -c1-200
rm -f $OUT/s/*/*.png; (cd $OUT && tar czf s.tgz s && rm -rf s)
