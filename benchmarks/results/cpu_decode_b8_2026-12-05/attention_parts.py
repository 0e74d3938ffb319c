"""Time inside the windowed attention of a CPU decode step at 8 x 300 tokens (served SmolLM2 config): the whole
_attend_windows, the closed blocks' decode, RoPE on read, SDPA, the KV store (journal 2026-12-05 22a). Run from
the repository root:
    PYTHONPATH=. python benchmarks/results/cpu_decode_b8_2026-12-05/attention_parts.py alrkvd-cpu (or fp16)"""
import os, sys, time, collections
sys.path.insert(0, ".")
import torch
import backend.kv_cache as kc
from backend.engine import EngineArgs, LLMEngine
from backend.sampling import SamplingParams
acc = collections.Counter()
def timed(name, f):
    def w(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[name] += time.perf_counter() - t; return r
    return w
eng = LLMEngine(EngineArgs(model="default", weight_dtype="float16", kv_format=sys.argv[1], kv_budget_bytes=128 << 20,
                           max_model_len=2048, max_num_seqs=8))
c = eng.cache
ids = eng.tokenizer.encode(open("data/wikitext-2-raw/wiki.test.raw").read()[:60000])
for i in range(8):
    eng.add_request(None, SamplingParams(max_tokens=64, temperature=0, ignore_eos=True),
                    prompt_ids=ids[i * 300:(i + 1) * 300])
while any(s.num_pending > 1 for s in eng.running + eng.waiting):
    eng.step()
for _ in range(3): eng.step()
c._attend_windows = timed("attend_windows", c._attend_windows)
c._closed_history = timed("closed_history", c._closed_history)
c.rotary.rotate = timed("rope", c.rotary.rotate)
kc.F.scaled_dot_product_attention = timed("sdpa", kc.F.scaled_dot_product_attention)
c.store_kv = timed("store_kv", c.store_kv)
acc.clear(); n = 6
t = time.perf_counter()
for _ in range(n): eng.step()
print("step ms", (time.perf_counter() - t) / n * 1e3)
for k, v in acc.most_common(): print(f"  {k:16s} {v / n * 1e3:7.1f} ms/step")
