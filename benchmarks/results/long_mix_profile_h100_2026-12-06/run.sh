# the history rebuilt inside the graph (branch exp/scratch-splits) against main under the long mix; then the profile
set -u; export PYTHONPATH=. PYTHONUNBUFFERED=1
t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
run() {  # dir arms tag
  (cd $1 && PYTHONPATH=. timeout 130 python benchmarks/bench_step_mix.py --long --arms $2 --users 16 --steps 150 \
    --warmup 60 --out $OUT/$3.json 2>&1 | grep -v "Warning\|no tuned" | sed "s|^|$3 |" | tee $OUT/$3.txt)
  echo "$3 done $(( $(date +%s) - t0 )) s"
}
run . alrkvd-gpu:pieces main_pieces
run .probe/scratch alrkvd-gpu:pieces scratch_pieces
run .probe/scratch alrkvd-gpu scratch_whole
timeout 150 python benchmarks/bench_step_mix.py --long --arms fp16,alrkvd-gpu:pieces --users 16 --steps 40 --warmup 60 \
  --profile --out $OUT/profile.json 2>&1 | grep -v "Warning\|no tuned" | tee $OUT/profile.txt
echo "all $(( $(date +%s) - t0 )) s"
