# call 3 (session 44): splits of a tiles launch from the context (tile_num_splits) against HEAD 9038229 (.probe/base),
# the engine under the long-context mix (16 users) and the short Locust mix (8 users)
set -u; export PYTHONUNBUFFERED=1
t0=$(date +%s)
run() {  # dir tag args...
  local dir=$1 tag=$2; shift 2
  (cd $dir && PYTHONPATH=. timeout 200 python benchmarks/bench_step_mix.py "$@" --out $OUT/$tag.json 2>&1 \
    | grep -v "Warning\|no tuned" | sed "s/^/$tag /" | tee -a $OUT/mix.txt)
  echo "$tag $(( $(date +%s) - t0 )) s"
}
run .probe/base long_base --long --arms fp16,alrkvd-gpu --users 16 --steps 200 --warmup 60
run . long_new --long --arms fp16,alrkvd-gpu --users 16 --steps 200 --warmup 60
run .probe/base short_base --arms fp16,alrkvd-gpu --users 8 --steps 200 --warmup 30
run . short_new --arms fp16,alrkvd-gpu --users 8 --steps 200 --warmup 30
