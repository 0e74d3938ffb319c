# call 2 (session 44): the engine under the long-context mix (bench_step_mix --long), three arms, 16 and 32 users
set -u; export PYTHONPATH=. PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 560 python benchmarks/bench_step_mix.py --long --arms fp16,alrkvd-gpu,alrkvd-gpu:pieces --users 16,32 \
  --steps 250 --warmup 60 --out $OUT/long_mix.json 2>&1 | grep -v "Warning\|no tuned" | tee $OUT/long_mix.txt
echo "mix $(( $(date +%s) - t0 )) s"
