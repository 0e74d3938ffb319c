# Session 53, call B: where ALR-KVD's 32-user steps lose to fp16's (engine alone, the served mix, profiled).
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python benchmarks/bench_step_mix.py --arms fp16:layered8,alrkvd-gpu:layered8 --users 32 --steps 200 \
  --warmup 30 --profile --out $OUT/mix32_profile.json > $OUT/mix32_profile.txt 2>&1
echo "== rc=$?"; grep -v "no tuned" $OUT/mix32_profile.txt | grep "users 32:" | cut -c1-700
python - $OUT/mix32_profile.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
tabs = {run["arm"]: {k["kernel"][:90]: (k["ms_per_step"], k["launches_per_step"]) for k in run["kernels"]} for run in r["runs"]}
a, b = list(tabs)
names = sorted(set(tabs[a]) | set(tabs[b]), key=lambda n: -abs(tabs[b].get(n, (0, 0))[0] - tabs[a].get(n, (0, 0))[0]))
print(f"{'kernel':90} {a:>18} {b:>18}  (ms a step, launches)")
for n in names[:40]:
    x, y = tabs[a].get(n, (0, 0)), tabs[b].get(n, (0, 0))
    print(f"{n:90} {x[0]:8.3f} {x[1]:7.1f}  {y[0]:8.3f} {y[1]:7.1f}")
PY
