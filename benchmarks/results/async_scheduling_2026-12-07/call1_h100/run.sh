# (.probe/old: `git archive 7f6365d backend kernels benchmarks/bench_engine.py benchmarks/devices.py server | tar -x -C .probe/old`)
# Engine: decode steps, default (sync) vs async_scheduling after the QueuedRead fix; served fp16 async vs default.
# H100: 7f6365d's backend (before QueuedRead) in the same call; the GPU graphs test (its async part).
# H200: issue 33's served figures, both caches, every default, beside fp16 with async_scheduling.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
B="--gpu --models qwen3-30b-a3b --batches 1,8,32 --contexts 4096 --kv-formats fp16 --steps 30"
t0=$(date +%s)
mkdir -p $OUT/s
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout 130 python benchmarks/bench_engine.py $B --modes graphs,async,graphs,async --out $OUT/engine_new.json > $OUT/engine_new.log 2>&1; echo "== new rc=$? $(( $(date +%s) - t0 ))s"
  models="qwen3_30b_alrkvd qwen3_30b qwen3_30b_async"
  for m in $models; do
    timeout 125 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "$m" > $OUT/served_$m.log 2>&1; echo "== served $m rc=$? $(( $(date +%s) - t0 ))s"
  done
else
  timeout 140 python benchmarks/bench_engine.py $B --modes graphs,async,graphs,async --out $OUT/engine_new.json > $OUT/engine_new.log 2>&1; echo "== new rc=$? $(( $(date +%s) - t0 ))s"
  models="qwen3_30b_async qwen3_30b"
  for m in $models; do
    timeout 120 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "$m" > $OUT/served_$m.log 2>&1; echo "== served $m rc=$? $(( $(date +%s) - t0 ))s"
  done
  (cd .probe/old && PYTHONPATH=. timeout 100 python benchmarks/bench_engine.py $B --modes graphs,async --out $OUT/engine_old.json > $OUT/engine_old.log 2>&1; echo "== old rc=$? $(( $(date +%s) - t0 ))s")
  timeout 60 python -m pytest -q -x tests/engine/test_cuda_graphs.py -k graphs_give_the_eager_tokens > $OUT/test_graphs.txt 2>&1; echo "== test rc=$?"; tail -2 $OUT/test_graphs.txt
fi
echo "== new"; grep -A20 "^model " $OUT/engine_new.log | grep -v "no tuned"
[ -f $OUT/engine_old.log ] && { echo "== old (7f6365d)"; grep -A20 "^model " $OUT/engine_old.log | grep -v "no tuned"; }
for m in $models; do echo "== $m"; grep -A5 "^| users | requests" $OUT/s/$m/report.md; done
rm -f $OUT/s/*/*.png; (cd $OUT && tar czf s.tgz s && rm -rf s)
