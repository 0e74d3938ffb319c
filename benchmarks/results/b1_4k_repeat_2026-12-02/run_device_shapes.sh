# One device call: the one-pass merge against the two-pass merge at B in {1, 8}, L in {4k, 32k}, alternated twice.
export PYTHONPATH=. ; D=benchmarks/results/b1_4k_repeat_2026-12-02
bench() { timeout 200 python benchmarks/bench_attention.py --no-tune --variants alrkvd-r16 --batches 1 8 \
    --lengths 4096 32768 --out $OUT/$1.json > $OUT/$1.log 2>&1 || echo "$1 failed"; }
for i in 1 2; do
  bench shapes_one_pass_$i
  git apply -R $D/merge_online.patch && bench shapes_two_pass_$i && git apply $D/merge_online.patch
done
python - <<'PY'
import json, os
out = os.environ["OUT"]
print("B | L | sdpa us | one-pass us (2 runs) | two-pass us (2 runs)")
runs = {k: [json.load(open(f"{out}/shapes_{k}_{i}.json"))["rows"] for i in (1, 2)] for k in ("one_pass", "two_pass")}
for b in (1, 8):
    for l in (4096, 32768):
        get = lambda rows, m: next(r["us"] for r in rows if r["B"] == b and r["L"] == l and r["method"] == m)
        print(b, l, f"{get(runs['one_pass'][0], 'sdpa'):.1f}",
              " / ".join(f"{get(r, 'alrkvd-r16'):.1f}" for r in runs["one_pass"]),
              " / ".join(f"{get(r, 'alrkvd-r16'):.1f}" for r in runs["two_pass"]), sep=" | ")
PY
