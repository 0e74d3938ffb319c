# Session 55: where the served 32-user step time goes (server against engine alone), fp16. ARMS: name:ENV=VAL
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
for arm in ${ARMS:-base:X=1 defer:ALRKVD_DEFER_SENDS=1}; do name=${arm%%:*}; envset=${arm#*:}
  mkdir -p $OUT/$name
  env $envset ALRKVD_STEP_TRACE=$OUT/$name/trace.jsonl timeout 250 \
    bash loadtest/gpu_serving.sh $OUT/$name 32 20s ${MODEL:-qwen3_30b} > $OUT/$name/served.log 2>&1
  echo "== $name rc=$?"; grep -A3 "^| users | requests" $OUT/$name/${MODEL:-qwen3_30b}/report.md
  python - $OUT/$name/trace.jsonl <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = rows[len(rows) // 5:]  # past the warm-up
for label, rs in (("all", rows), ("decode32", [r for r in rows if r[7] >= 30 and r[5] == r[7]])):
    step = [1e3 * (r[2] - r[1]) for r in rs]; send = [1e3 * (r[3] - r[2]) for r in rs]
    gap = [1e3 * (b[0] - a[0]) for a, b in zip(rs, rs[1:])]
    print(f"{label}: n {len(rs)} step p50 {st.median(step):.2f} mean {st.mean(step):.2f} | send mean {st.mean(send):.2f}"
          f" | loop top-to-top p50 {st.median(gap):.2f} mean {st.mean(gap):.2f}")
PY
done
if [ -n "${MIX:-}" ]; then
timeout 200 python benchmarks/bench_step_mix.py --arms fp16:layered8 --users 32 --steps 200 --warmup 30 \
  --out $OUT/mix_fp16.json > $OUT/mix_fp16.txt 2>&1; echo "== mix rc=$?"; tail -8 $OUT/mix_fp16.txt
fi
rm -f $OUT/*/*/*.png $OUT/*/*/locust.html
