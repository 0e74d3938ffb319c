# call 6 (session 44): the engine under the long-context mix, ALR-KVD with graph pieces, GRAPH_MAX_HISTORY_READS 3M
# (this code) against 1.5M (the value before), 16 users
set -u; export PYTHONPATH=. PYTHONUNBUFFERED=1
t0=$(date +%s)
for limit in 1500000 3000000; do
timeout 120 python - $limit <<'PY' 2>&1 | grep -v "Warning\|no tuned" | sed "s/^/limit $limit /" | tee -a $OUT/limit.txt
import runpy, sys, os
import backend.cuda_graphs as g
g.GRAPH_MAX_HISTORY_READS = int(sys.argv[1])
sys.argv = ["bench_step_mix.py", "--long", "--arms", "alrkvd-gpu:pieces", "--users", "16", "--steps", "200",
            "--warmup", "60", "--out", os.environ["OUT"] + f"/limit_{g.GRAPH_MAX_HISTORY_READS}.json"]
runpy.run_path("benchmarks/bench_step_mix.py", run_name="__main__")
PY
echo "limit $limit $(( $(date +%s) - t0 )) s"
done
