# Session 53, call H: mixed graphs to 512 tokens against 256 at 8 and 32 users, both caches (engine alone, the served mix)
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 340 python benchmarks/bench_step_mix.py --arms fp16:layered8,fp16:layered8:graphs512,alrkvd-gpu:layered8,alrkvd-gpu:layered8:graphs512 \
  --users 8,32 --steps 150 --warmup 30 --out $OUT/mix_graphs512.json > $OUT/mix_graphs512.txt 2>&1
echo "== rc=$?"; grep "users" $OUT/mix_graphs512.txt | grep -v "no tuned" | cut -c1-640
