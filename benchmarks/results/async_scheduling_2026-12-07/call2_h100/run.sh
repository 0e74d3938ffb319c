# (.probe/old: `git archive 7f6365d backend kernels benchmarks/bench_engine.py benchmarks/devices.py server | tar -x -C .probe/old`)
# The queued arm timed out here (120 s, the first server on a cold machine); it ran again at once on the same warm
# machine: `timeout 150 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s qwen3_30b_async` (served/qwen3_30b_async).
# After the fix (a queued step that queues nothing behind it hands the last outputs over before its wait): served
# fp16 with async_scheduling against the default; engine decode steps, sync vs async, this backend and 7f6365d's
# (before QueuedRead) in turns.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
B="--gpu --models qwen3-30b-a3b --batches 1,32 --contexts 4096 --kv-formats fp16 --steps 30"
t0=$(date +%s)
mkdir -p $OUT/s
for m in qwen3_30b_async qwen3_30b; do
  timeout 120 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "$m" > $OUT/served_$m.log 2>&1; echo "== served $m rc=$? $(( $(date +%s) - t0 ))s"
done
timeout 60 python benchmarks/bench_engine.py $B --modes graphs,async --out $OUT/engine_new1.json > $OUT/engine_new1.log 2>&1; echo "== new1 rc=$? $(( $(date +%s) - t0 ))s"
(cd .probe/old && PYTHONPATH=. timeout 60 python benchmarks/bench_engine.py $B --modes graphs --out $OUT/engine_old.json > $OUT/engine_old.log 2>&1; echo "== old rc=$? $(( $(date +%s) - t0 ))s")
timeout 60 python benchmarks/bench_engine.py $B --modes graphs,async --out $OUT/engine_new2.json > $OUT/engine_new2.log 2>&1; echo "== new2 rc=$? $(( $(date +%s) - t0 ))s"
for f in new1 old new2; do echo "== $f"; grep -A8 "^model " $OUT/engine_$f.log | grep -v "no tuned"; done
for m in qwen3_30b_async qwen3_30b; do echo "== $m"; grep -A5 "^| users | requests" $OUT/s/$m/report.md; done
rm -f $OUT/s/*/*.png; (cd $OUT && tar czf s.tgz s && rm -rf s)
