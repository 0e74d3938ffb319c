"""The 4.52x preset on the three 16k-token WikiText-2 texts against fp16, from the CPU result files: Lloyd-Max,
trellis of 9 and of 12 state bits. A text measured in parts (quality_sweep --first-token) is combined by mean NLL
over its windows (equal token counts). Over the three texts: the geometric mean of the perplexities.
Usage: PYTHONPATH=. python benchmarks/results/trellis_gpu_2026-12-02/summarize.py"""
import glob
import json
import math

R = "benchmarks/results/"
PRESET = dict(block_size=32, k_bits=3, v_bits=3, rank_budget=16, key_weight=16.0, latent_bits=3, basis_bits=4,
              scale_bits=8, v_low_tokens=25, sink_tokens=1)
FILES = {"first": ["quality_cpu_2026-11-29", "quality_sink_cpu_2026-12-02", "quality_trellis_cpu_2026-12-02",
                   "quality_trellis12_cpu_2026-12-02"],
         "held-out": ["quality_heldout_cpu_2026-11-30", "quality_heldout_sink_cpu_2026-12-02",
                      "quality_heldout_trellis_cpu_2026-12-02", "quality_heldout_trellis12_cpu_2026-12-02"],
         "third": ["quality_third_text_sink_cpu_2026-12-02", "quality_third_text_trellis_cpu_2026-12-02",
                   "quality_third_text_trellis12_cpu_2026-12-02_part*"]}


def variant(r):
    o = r["kv_options"]
    if r["kv"] == "fp16":
        return "fp16"
    if r["kv"] != "alrkvd" or any(o.get(k) != v for k, v in PRESET.items()):
        return None
    return o["codebook"] if o["codebook"] == "gauss" else f"trellis L{o.get('trellis_state_bits') or 9}"


nll = {}          # (text, variant) -> [(nll, tokens), ...]
for text, names in FILES.items():
    for name in names:
        for path in sorted(glob.glob(R + name + ".jsonl")):
            for ln in open(path):
                r = json.loads(ln)
                v = variant(r)
                if v and (r["tokens"] == 16376 or "_part" in path):
                    nll.setdefault((text, v), {})[(path, r.get("first_token", 0))] = (r["nll"], r["tokens"])
ppl = {key: math.exp(sum(n * t for n, t in parts.values()) / sum(t for _, t in parts.values()))
       for key, parts in nll.items() if sum(t for _, t in parts.values()) == 16376}
for v in ("gauss", "trellis L9", "trellis L12"):
    cells, logs = [], []
    for text in FILES:
        if (text, v) in ppl:
            d = ppl[text, v] / ppl[text, "fp16"] - 1
            cells.append(f"{text} {ppl[text, v]:.4f} ({d:+.2%})")
            logs.append(math.log(1 + d))
    three = f", three texts {math.exp(sum(logs) / 3) - 1:+.2%}" if len(logs) == 3 else ""
    print(f"{v}: " + ", ".join(cells) + three)
print("fp16: " + ", ".join(f"{t} {ppl[t, 'fp16']:.4f}" for t in FILES if (t, "fp16") in ppl))
