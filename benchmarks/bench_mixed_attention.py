"""One layer's attention in a mixed step of the GPU load test's config (dummy Qwen3-30B-A3B, `bench_step_mix.py`'s
served engine): `--decodes` sequences decoding after `--context` tokens beside a prompt chunk of `--chunk` tokens
after `--context` cached, per arm. The step runs once, graph-shaped but eager; the attention launches of its first
layer (the cache's `decode_kernel` and `tiles_kernel` calls, with their arguments) are captured in a CUDA graph and
replayed: microseconds of GPU a layer, the host's launch cost out. Then the same for the decode-only step that
follows. Arms as `bench_step_mix.py`'s: `alrkvd-gpu` reads the decodes in a launch of their own beside the chunk's
tiles (`PagedKVCache.rows_apart`, the default), `alrkvd-gpu:tiles` in the tiles too.

    python benchmarks/bench_mixed_attention.py --arms fp16,alrkvd-gpu:tiles,alrkvd-gpu --contexts 226,1024,4096
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.sampling import SamplingParams  # noqa: E402
from benchmarks.bench_step_mix import served_engine  # noqa: E402

LAUNCHES = ("decode_kernel", "tiles_kernel")


def graph_us(launches: list, reps: int = 20) -> float:
    """Microseconds of GPU for one run of `launches` [(fn, args, kwargs)]: captured in a CUDA graph, replayed."""
    def run():
        for fn, args, kwargs in launches:
            fn(*args, **kwargs)
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e3


def first_layer_launches(engine) -> list:
    """Runs one engine step, graph-shaped but eager (a replay calls no launch); the attention launches of its first
    layer, as they were called (the launches of one layer share their cache argument)."""
    cache, calls = engine.cache, []
    originals = {name: getattr(cache, name) for name in LAUNCHES if getattr(cache, name, None) is not None}
    for name, fn in originals.items():
        setattr(cache, name, lambda *a, fn=fn, **k: calls.append((fn, a, k)) or fn(*a, **k))
    engine.graphs.capture, engine.graphs.graphs = False, {}  # the graph-shaped step run eagerly: the same launches
    try:
        engine.step()
    finally:
        for name, fn in originals.items():
            setattr(cache, name, fn)
    assert calls, "the step ran no attention launch"
    first_layer = calls[0][1][1]
    return calls[:next((i for i, c in enumerate(calls) if c[1][1] is not first_layer), len(calls))]


def measure(engine, context: int, chunk: int, decodes: int) -> dict:
    """Both steps' first-layer attention in `engine`, its requests aborted after."""
    cache, rids = engine.cache, []

    def running(prompt_len: int, cached: int, max_tokens: int):  # a sequence with `cached` tokens in the cache
        rids.append(engine.add_request(None, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
                                       prompt_ids=[1] * prompt_len))
        seq = engine.requests[rids[-1]]
        cache.allocate(seq.kv, cached)
        seq.kv.num_tokens = cached
        engine.waiting.remove(seq)
        engine.running.append(seq)

    for _ in range(decodes):
        running(context, context - 1, 50)
    running(context + chunk, context, 1)
    mixed = first_layer_launches(engine)
    decode = first_layer_launches(engine)
    row = {"context": context, "chunk": chunk, "decodes": decodes, "mixed_launches": len(mixed),
           "mixed_us": round(graph_us(mixed), 1), "decode_us": round(graph_us(decode), 1)}
    for rid in rids:
        engine.abort(rid)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", default="fp16,alrkvd-gpu:tiles,alrkvd-gpu")
    p.add_argument("--contexts", default="226,1024,4096")
    p.add_argument("--chunk", type=int, default=225)
    p.add_argument("--decodes", type=int, default=31)
    p.add_argument("--out")
    a = p.parse_args()
    rows = []
    for arm in a.arms.split(","):
        engine = served_engine(arm)
        for context in map(int, a.contexts.split(",")):
            rows.append({"arm": arm, **measure(engine, context, a.chunk, a.decodes)})
            print(json.dumps(rows[-1]), flush=True)
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    print("| context | " + " | ".join(f"{arm} mixed / decode us" for arm in a.arms.split(",")) + " |")
    for context in map(int, a.contexts.split(",")):
        cells = [f"{r['mixed_us']} / {r['decode_us']}" for r in rows if r["context"] == context]  # arms in order
        print(f"| {context} | " + " | ".join(cells) + " |")
    if a.out:
        Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
