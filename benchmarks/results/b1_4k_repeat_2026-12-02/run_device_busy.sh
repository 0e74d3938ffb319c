# One device call: the busy-splits change (the working tree) against the kernel before it (busy_splits.patch
# reversed): kernel and CUDA-graph tests compiled; bench_attention at B in {1, 8}, L in {4k, 32k}, alternated twice;
# then the engine's decode step (dummy Qwen3-30B-A3B, CUDA graphs, B=1, 4k context) with and without it.
export PYTHONPATH=. ; D=benchmarks/results/b1_4k_repeat_2026-12-02
timeout 200 python -m pytest -q tests/test_kernels_alrkvd_attention.py tests/test_cuda_graphs.py 2>&1 \
    | grep -E "Error|FAILED|passed|failed" | head
bench() { timeout 150 python benchmarks/bench_attention.py --no-tune --variants alrkvd-r16 --batches 1 8 \
    --lengths 4096 32768 --out $OUT/$1.json > $OUT/$1.log 2>&1 || echo "$1 failed"; }
for i in 1 2; do
  bench busy_$i
  git apply -R $D/busy_splits.patch && bench before_$i && git apply $D/busy_splits.patch
done
python - <<'PY'
import json, os
out = os.environ["OUT"]
print("B | L | sdpa us | busy splits us (2 runs) | before us (2 runs)")
runs = {k: [json.load(open(f"{out}/{k}_{i}.json"))["rows"] for i in (1, 2)] for k in ("busy", "before")}
for b in (1, 8):
    for l in (4096, 32768):
        get = lambda rows, m: next(r["us"] for r in rows if r["B"] == b and r["L"] == l and r["method"] == m)
        print(b, l, f"{get(runs['busy'][0], 'sdpa'):.1f}", " / ".join(f"{get(r, 'alrkvd-r16'):.1f}" for r in runs["busy"]),
              " / ".join(f"{get(r, 'alrkvd-r16'):.1f}" for r in runs["before"]), sep=" | ")
PY
e2e() { timeout 170 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 1 --contexts 4096 \
    --kv-formats fp16,alrkvd --modes graphs --steps 20 --out $OUT/$1.json 2>&1 | tail -4; }
echo "engine, busy splits:"; e2e engine_busy
git apply -R $D/busy_splits.patch && echo "engine, before:" && e2e engine_before && git apply $D/busy_splits.patch
