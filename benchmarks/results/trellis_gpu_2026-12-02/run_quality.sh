# Device call 3 and later (carry reports/gguf2; calls 1-2 left .device, /tmp/site and reports/gguf1): 16k-token
# perplexity on the H200 of the three WikiText-2 texts, each in PARTS processes (default 4) of 16384 / PARTS tokens
# (whole 2048-token windows, so together they score the windows of one 16k run), all in parallel. A sweep skips
# configurations already in its --out, so a later call resumes; each stops after LIMIT seconds (default 540) so that
# the results come back within a call. Prints each text's perplexity over its parts (mean NLL, equal token counts).
# From the repo root: source .device/setup.sh && bash benchmarks/results/trellis_gpu_2026-12-02/run_quality.sh [configs...]
export PYTHONPATH=/tmp/site:.
M=/tmp/smollm2.gguf
[ -f $M ] || cat reports/gguf1/* reports/gguf2/* > $M
md5sum $M
R=/tmp/quality; mkdir -p $R
PARTS=${PARTS:-4}; N=$((16384 / PARTS))
python3 -c "t=open('data/wikitext-2-raw/wiki.test.raw',encoding='utf-8',newline='').read()
for n in (100000, 300000): open(f'$R/wiki_test_after_{n//1000}k_chars.raw','w',encoding='utf-8',newline='').write(t[n:])"
for t in first 100k 300k; do
  text=data/wikitext-2-raw/wiki.test.raw; [ $t = first ] || text=$R/wiki_test_after_${t}_chars.raw
  for i in $(seq 0 $((PARTS - 1))); do
    timeout ${LIMIT:-540} python3 benchmarks/quality_sweep.py --device cuda --dtype float32 --model $M --text $text \
        --first-token $((i * N)) --max-tokens $N --out $R/${t}_part$i.jsonl "$@" > $R/log_${t}_$i.txt 2>&1 &
  done
done
wait
cd $R && tar czf $OUT/quality.tgz *.jsonl log_*.txt
python3 - <<'PY'
import collections, glob, json, math
runs = collections.defaultdict(list)
for f in sorted(glob.glob("/tmp/quality/*_part*.jsonl")):
    for ln in open(f):
        r = json.loads(ln)
        runs[(f.split("/")[-1].split("_part")[0], r["config"])].append(r)
for (text, config), rs in sorted(runs.items()):
    nll = sum(r["nll"] * r["tokens"] for r in rs) / sum(r["tokens"] for r in rs)
    print(f"{text:6s} {len(rs)} parts {sum(r['tokens'] for r in rs):6d} tokens  ppl {math.exp(nll):.4f}  "
          f"x{rs[0].get('compression_16bit_window', 1):.2f}  {max(r['seconds'] for r in rs):.0f} s  {config}")
PY
