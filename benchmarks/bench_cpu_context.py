"""CPU decode step time against context length and batch, the served SmolLM2 config, ALR-KVD against fp16 KV.

On the CPU the PyTorch attention path decompresses a sequence's whole compressed history every step;
this measures what that costs as the context and the batch grow, and which share of the step it is
(time inside the format's `decode`), and the prefill before. Greedy, WikiText-2 text as the prompts (a
different stretch per sequence).

    python benchmarks/bench_cpu_context.py --out benchmarks/results/cpu_alrkvd_read_2026-12-05/cpu_context.json
    python benchmarks/bench_cpu_context.py --batches 4,8 --contexts 300 \
        --out benchmarks/results/cpu_alrkvd_read_2026-12-05/cpu_batches.json
    python benchmarks/bench_cpu_context.py --batches 4,8 --contexts 1024 --chunk 128   # steps with a prompt chunk
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from backend.engine import EngineArgs, LLMEngine  # noqa: E402
from backend.sampling import SamplingParams  # noqa: E402

TEXT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data/wikitext-2-raw/wiki.test.raw")


def measure(engine, ids, context, steps, decode_time, batch=1, chunk=0):
    """Median step time (ms) and share inside the format's decode of `steps` decode steps of `batch` sequences with
    `context` tokens each (different text), the time (ms) to all their first tokens, and with `chunk` the median
    time (ms) of a step that carries the decodes and a new prompt of `chunk` tokens (0 without)."""
    rids = [f"ctx{context}-{i}" for i in range(batch)]
    for i, rid in enumerate(rids):
        # room to go on decoding while later prompts prefill (they queue for the step's token budget)
        engine.add_request(None, SamplingParams(max_tokens=engine.max_model_len - context, temperature=0,
                                                ignore_eos=True),
                           request_id=rid, prompt_ids=ids[i * context:(i + 1) * context])
    t = time.perf_counter()
    while any(engine.requests[rid].output_ids == [] for rid in rids):  # prefill, first tokens
        engine.step()
    prefill = time.perf_counter() - t
    times, reads = [], []
    for _ in range(steps):
        decode_time[0] = 0.0
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
        reads.append(decode_time[0])
    mixed = []
    for i in range(steps if chunk else 0):  # a prompt arrives: its first chunk rides with the decodes
        start = (batch + i) * context
        rid = engine.add_request(None, SamplingParams(max_tokens=1), prompt_ids=ids[start:start + chunk])
        t = time.perf_counter()
        engine.step()
        mixed.append(time.perf_counter() - t)
        engine.abort(rid)
    for rid in rids:
        engine.abort(rid)
    return (statistics.median(times) * 1e3, statistics.median(r / t for r, t in zip(reads, times)), prefill * 1e3,
            statistics.median(mixed) * 1e3 if mixed else 0.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="128,512,1024,1920")
    ap.add_argument("--formats", default="alrkvd-cpu,fp16", help="kv formats or presets (alrkvd-cpu: the CPU configs')")
    ap.add_argument("--batches", default="1", help="sequences decoding together, each of the context's length")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=0, help="also time steps that carry a new prompt of this many tokens")
    ap.add_argument("--out")
    a = ap.parse_args()
    decode_time = [0.0]

    inside = [False]  # a decode within a timed decode (decode_layers a layer at a time) is counted once

    def timed(decode):
        def wrapper(*args, **kwargs):
            if inside[0]:
                return decode(*args, **kwargs)
            inside[0], t = True, time.perf_counter()
            try:
                return decode(*args, **kwargs)
            finally:
                inside[0] = False
                decode_time[0] += time.perf_counter() - t
        return wrapper

    rows = []
    for fmt in a.formats.split(","):
        engine = LLMEngine(EngineArgs(model="default", weight_dtype="float16", kv_format=fmt, kv_budget_bytes=128 << 20,
                                      max_model_len=2048, max_num_seqs=8))
        f = engine.cache.format  # the rebuild of stored blocks, one layer's or several layers' at once
        f.decode, f.decode_layers = timed(f.decode), timed(f.decode_layers)
        ids = engine.tokenizer.encode(open(TEXT).read()[:200000])
        measure(engine, ids, 64, 2, decode_time)  # warm-up
        for batch in map(int, a.batches.split(",")):
            for ctx in map(int, a.contexts.split(",")):
                ms, share, prefill, mixed = measure(engine, ids, ctx, a.steps, decode_time, batch, a.chunk)
                rows.append({"format": fmt, "batch": batch, "context": ctx, "step_ms": round(ms, 1),
                             "decode_share": round(share, 3), "prefill_ms": round(prefill)}
                            | ({"chunk": a.chunk, "mixed_step_ms": round(mixed, 1)} if a.chunk else {}))
                print(f"{fmt:7s} batch {batch} context {ctx:5d}: {ms:7.1f} ms a step, {share:.0%} of it rebuilding "
                      f"stored blocks; prefill {prefill:6.0f} ms"
                      + (f"; with a {a.chunk}-token prompt {mixed:7.1f} ms" if a.chunk else ""), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "machine": "CPU", "steps": a.steps, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
