# call 5 (session 44): ALR-KVD mixed steps over long compressed histories, forced into one graph (the history-reads
# limit lifted) against eager, with the tiles launch's splits from the context
set -u; export PYTHONPATH=. PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 250 python - <<'PY' 2>&1 | grep -v "Warning\|no tuned" | tail -4
import runpy, sys, os
import backend.cuda_graphs as g
g.GRAPH_MAX_HISTORY_READS = 1 << 62
sys.argv = ["bench_engine.py", "--gpu-mixed", "256", "--models", "qwen3-30b-a3b", "--batches", "8",
            "--contexts", "2048,8192,16384", "--kv-formats", "alrkvd-gpu", "--mixed-graphs", "whole", "--steps", "3",
            "--out", os.environ["OUT"] + "/mixed256_forced.json"]
runpy.run_path("benchmarks/bench_engine.py", run_name="__main__")
PY
echo "forced $(( $(date +%s) - t0 )) s"
