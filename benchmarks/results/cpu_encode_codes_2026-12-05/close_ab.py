"""The encode's codes by counting edges (backend.kv_formats.codecs.gauss_codes) against torch.bucketize, in the CPU
server's engine (SmolLM2-135M, fp16 weights, `alrkvd-cpu` KV): 8 sequences of 300-356 prompt tokens decoding 64
steps, staggered so that one of them closes a block every 8 steps; the arms alternate in one engine, four rounds.
Prints the median step that closes a block, the median other step and the median prefill of the 8 prompts per arm
(journal 2026-12-05 22b). From the repository root:
    PYTHONPATH=. python benchmarks/results/cpu_encode_codes_2026-12-05/close_ab.py
"""
import os, sys, time, statistics
import torch
from backend.kv_formats import codecs as C
from backend.engine import EngineArgs, LLMEngine
from backend.sampling import SamplingParams
new = C.gauss_codes
def old(y, bits):
    lv = C.gauss_codebook(bits).to(y.device)
    return torch.bucketize(y.contiguous(), (lv[1:] + lv[:-1]) / 2).to(torch.int32)
eng = LLMEngine(EngineArgs(model="default", weight_dtype="float16", kv_format="alrkvd-cpu", kv_budget_bytes=128 << 20,
                           max_model_len=2048, max_num_seqs=8))
ids = eng.tokenizer.encode(open("data/wikitext-2-raw/wiki.test.raw").read()[:80000])
bs = eng.cache.block_size
res = {"old": [[], [], []], "new": [[], [], []]}
for rnd in range(4):
    for arm, fn in (("old", old), ("new", new)) if rnd % 2 == 0 else (("new", new), ("old", old)):
        C.gauss_codes = fn
        for i in range(8):
            start = i * 400 + rnd * 10
            eng.add_request(None, SamplingParams(max_tokens=80, temperature=0, ignore_eos=True),
                            request_id=f"{arm}{rnd}-{i}", prompt_ids=ids[start:start + 300 + 8 * i])
        t = time.perf_counter()
        while any(s.num_pending > 1 for s in eng.running + eng.waiting):
            eng.step()
        res[arm][2].append((time.perf_counter() - t) * 1e3)
        for _ in range(64):
            closes = sum((s.kv.num_tokens + 1) % bs == 0 for s in eng.running)
            t = time.perf_counter(); eng.step(); dt = (time.perf_counter() - t) * 1e3
            res[arm][0 if closes else 1].append(dt)
        for s in list(eng.running): eng.abort(s.request_id)
        while eng.running or eng.waiting: eng.step()
for arm, (c, o, p) in res.items():
    print(f"{arm}: steps closing a block {len(c)}, median {statistics.median(c):.1f} ms; others {len(o)}, median "
          f"{statistics.median(o):.1f} ms; prefill of 8 prompts median {statistics.median(p):.0f} ms")
