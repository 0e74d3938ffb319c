# Device call 3 and later (carry reports/gguf2; calls 1-2 left .device, /tmp/site and reports/gguf1): 16k-token
# perplexity of the 4.52x preset on the H200, the three WikiText-2 texts in parallel (one process each), fp16
# first. A sweep skips configurations already in its --out, so a later call resumes where this one stopped
# (each sweep is stopped after LIMIT seconds, default 560, so that the results come back within a call).
# From the repo root: source .device/setup.sh && bash benchmarks/results/trellis_gpu_2026-12-02/run_quality.sh [configs...]
export PYTHONPATH=/tmp/site:.
M=/tmp/smollm2.gguf
[ -f $M ] || cat reports/gguf1/* reports/gguf2/* > $M
md5sum $M
R=/tmp/quality; mkdir -p $R
python3 -c "t=open('data/wikitext-2-raw/wiki.test.raw',encoding='utf-8',newline='').read()
for n in (100000, 300000): open(f'$R/wiki_test_after_{n//1000}k_chars.raw','w',encoding='utf-8',newline='').write(t[n:])"
for t in first 100k 300k; do
  text=data/wikitext-2-raw/wiki.test.raw; [ $t = first ] || text=$R/wiki_test_after_${t}_chars.raw
  timeout ${LIMIT:-560} python3 benchmarks/quality_sweep.py --device cuda --dtype float32 --model $M --max-tokens 16384 --text $text \
      --out $R/quality_$t.jsonl "$@" > $R/log_$t.txt 2>&1 &
done
wait
cp $R/*.jsonl $R/log_*.txt $OUT/ 2>/dev/null
python3 - <<'PY'
import glob, json
for f in sorted(glob.glob("/tmp/quality/quality_*.jsonl")):
    for ln in open(f):
        r = json.loads(ln)
        o = {k: v for k, v in r["kv_options"].items() if k in ("codebook", "trellis_state_bits")}
        print(f.split("_")[-1], r["kv"], o, f"ppl {r['ppl']:.4f}", f"x{r.get('compression_16bit_window', 1):.2f}",
              f"{sum(w['seconds'] for w in r['per_window']):.0f} s")
PY
