# Session 53, call E: ALR-KVD's tiles in splits of 2,048 keys (36a): served against fp16 in one call, then the engine mix.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/s
timeout 330 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "qwen3_30b_alrkvd qwen3_30b"
for m in qwen3_30b_alrkvd qwen3_30b; do echo "== $m"; grep -A5 "^| users | requests" $OUT/s/$m/report.md; done
rm -f $OUT/s/*/*.png
(cd $OUT && tar czf s.tgz s && rm -rf s)
timeout 200 python benchmarks/bench_step_mix.py --arms alrkvd-gpu:layered8,fp16:layered8 --users 32 --steps 200 \
  --warmup 30 --out $OUT/mix32.json > $OUT/mix32.txt 2>&1
echo "== mix rc=$?"; grep "users 32:" $OUT/mix32.txt | cut -c1-700
