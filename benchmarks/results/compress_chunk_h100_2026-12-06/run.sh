# blocks per compression call: 128 (main) against 384 and 768, the compression alone and under the long mix
set -u; export PYTHONPATH=. PYTHONUNBUFFERED=1
t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
for c in 128 768; do
  CHUNK=$c timeout 100 python .probe/chunk.py benchmarks/bench_basis.py --step --out $OUT/step_$c.json 2>&1 \
    | grep -v "Warning\|no tuned\|warn" | sed "s|^|step $c |" | tail -12
  echo "step $c done $(( $(date +%s) - t0 )) s"
done
for c in 128 384 768; do
  CHUNK=$c timeout 110 python .probe/chunk.py benchmarks/bench_step_mix.py --long --arms alrkvd-gpu:pieces --users 16 \
    --steps 150 --warmup 60 --out $OUT/mix_$c.json 2>&1 | grep -v "Warning\|no tuned\|warn" | sed "s|^|mix $c |"
  echo "mix $c done $(( $(date +%s) - t0 )) s"
done
timeout 100 python benchmarks/bench_step_mix.py --long --arms fp16 --users 16 --steps 150 --warmup 60 --out $OUT/mix_fp16.json \
  2>&1 | grep -v "Warning\|no tuned\|warn" | sed "s|^|mix fp16 |"
echo "all $(( $(date +%s) - t0 )) s"
