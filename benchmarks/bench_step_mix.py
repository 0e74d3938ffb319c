"""The engine's steps under the GPU load test's mix, without the server: dummy Qwen3-30B-A3B with the served
config of `loadtest/gpu_serving.sh` (16 GiB of KV, 8,192 positions, 32 sequences, chunks of 2,048, graphs to 512
tokens), a closed loop of `users` streams alternating at random between the tenants of `loadtest/tenants_gpu.yaml`
in tokens (chats: 25-50 prompt tokens, 64 out; summaries: 400-650 prompt tokens, 128 out; one to one). Every step is
synchronised and timed, with its kind: decode only, prompt rows in one graph, graph pieces (ALR-KVD and KIVI with
`piecewise_graphs`: a chunk across blocks that no run holds, a long compressed history), eager; and with the time of
its forward and of the block compression (each synchronised), and its chunks' longest history. A decode row waits
its step's time: their p99 over their p50 is what the load test's inter-token ratio comes to without the server; and
each tenant's time to first token, from its arrival; prompt tokens and decodes a second over the steps. A synthetic
step (`bench_engine.py --gpu-mixed`) misses what a mix makes: new sequences, several chunks a step, prompts across
blocks.

    python benchmarks/bench_step_mix.py --arms fp16,alrkvd-gpu,alrkvd-gpu:pieces --users 8,32 --out mix.json
    (`alrkvd-gpu:rows`: a chunk's rows read one by one, not in tiles, for a baseline; modes combine:
    `alrkvd-gpu:layered8:tiles`)

`--long`: the long-context tenants' served config instead (`qwen3_30b_long_*` of `loadtest/gpu_serving.sh`: 8 GiB of
KV, 40,960 positions, 64 sequences, `max_step_ms` 80, graphs to 2,048 tokens) and their mix in tokens, two chats to a
document (`loadtest/tenants_long.yaml`: documents of 16k-32k tokens, 32 out; chats of 500-6,000, 96 out).
`--profile`: the measured steps' GPU time by kernel (torch.profiler), per arm and user count. Each step counts the
Triton compiles inside it (none is expected after the engine's warm-up).
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.sampling import SamplingParams  # noqa: E402
from benchmarks.bench_engine import dummy_engine, rows_one_by_one  # noqa: E402

TENANTS = {"chat": ((25, 50), 64, 1), "summarize": ((400, 650), 128, 1)}  # (prompt tokens, max tokens, weight)
LONG_TENANTS = {"chat": ((500, 6000), 96, 2), "document": ((16000, 32000), 32, 1)}
KINDS = ("decode", "graph", "pieces", "eager", "layered")


def served_engine(arm: str, long: bool = False):
    """`arm`: a KV format (`fp16`, `alrkvd-gpu`, ...) and modes after colons: `:pieces` for piecewise graphs, `:rows`
    for ALR-KVD's chunk rows read one by one in mixed graphs (not in tiles), `:tiles` for a mixed graph's decodes read
    in the chunks' tiles too (`PagedKVCache.rows_apart` 0; by default they are read apart), `:layeredG` for
    `layered_prefill=G`, `:graphsN` for graphs to N tokens (`cuda_graph_max_tokens`)."""
    kv_format, *modes = arm.split(":")

    def number(prefix: str) -> int | None:  # `:layered8` -> 8
        return next((int(m[len(prefix):]) for m in modes if m.startswith(prefix)), None)

    served = (dict(kv_budget_bytes=8 << 30, max_model_len=40960, max_num_seqs=64, max_step_ms=80.0,
                   cuda_graph_max_tokens=2048) if long else
              dict(kv_budget_bytes=16 << 30, max_model_len=8192, max_num_seqs=32))
    graph_tokens = number("graphs")
    if graph_tokens is not None:
        served["cuda_graph_max_tokens"] = graph_tokens
    engine = dummy_engine("qwen3-30b-a3b", kv_format, max_num_batched_tokens=2048, piecewise_graphs="pieces" in modes,
                          layered_prefill=number("layered") or 0, **served)
    if "tiles" in modes:
        engine.cache.rows_apart = 0
    return rows_one_by_one(engine) if "rows" in modes else engine


def timed(fn, spent: dict, key: str):
    """`fn`, synchronised, its milliseconds added to spent[key] and its results kept in spent[key + "_out"]."""
    def wrapped(*args, **kwargs):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        torch.cuda.synchronize()
        spent[key] += (time.perf_counter() - t) * 1e3
        spent[key + "_out"].append(out)
        return out
    return wrapped


def count_compiles() -> list[int]:
    """A counter of Triton's JIT compiles from now on ([n]; Triton's `jit_cache_hook`, called before each compile): a
    compile inside the measured steps stalls one for a second or more (journal 2026-12-05 20c, 2026-12-07 32a)."""
    from triton import knobs

    count = [0]

    def hook(*args, **kwargs):
        count[0] += 1
        return False  # (true would skip the compile)

    knobs.runtime.jit_cache_hook = hook
    return count


def run(engine, users: int, steps: int, warmup: int, seed: int = 0, tenants: dict = TENANTS,
        profiler=None) -> tuple[list[dict], list[tuple[str, float]]]:
    """Every step after `warmup` (a row each), and (tenant, ms from its arrival to its first token) of the requests
    that arrived after it. `profiler` (torch.profiler, not started): it records the measured steps."""
    rng = random.Random(seed)
    names = [name for name in sorted(tenants) for _ in range(tenants[name][2])]
    arrived: dict[str, tuple[str, float]] = {}  # request id -> (tenant, arrival), until its first token
    first_tokens: list[tuple[str, float]] = []

    def submit(measured: bool):
        tenant = rng.choice(names)
        (lo, hi), max_tokens, _ = tenants[tenant]
        rid = engine.add_request(None, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
                                 prompt_ids=[rng.randint(100, 40000) for _ in range(rng.randint(lo, hi))])
        if measured:
            arrived[rid] = (tenant, time.perf_counter())

    cache, graphs = engine.cache, engine.graphs
    compress, replay, run_pieces = cache.compress, graphs.run, graphs._run_pieces
    spent = {}
    cache.compress, graphs.run = timed(compress, spent, "compress"), timed(replay, spent, "forward")
    graphs._run_pieces = lambda *args: spent["pieces_out"].append(1) or run_pieces(*args)  # (a step in graph pieces)
    for _ in range(users):
        submit(False)
    rows, profiling, compiles = [], False, count_compiles()
    try:
        for i in range(warmup + steps):
            if profiler is not None and i == warmup:
                profiler.start()
                profiling = True
            spent.update(compress=0.0, forward=0.0, compress_out=[], forward_out=[], pieces_out=[])
            compiled = compiles[0]
            torch.cuda.synchronize()
            t = time.perf_counter()
            outputs = engine.step()
            torch.cuda.synchronize()
            end = time.perf_counter()
            ms = (end - t) * 1e3
            for out in outputs:
                if out.request_id in arrived:
                    tenant, at = arrived.pop(out.request_id)
                    first_tokens.append((tenant, (end - at) * 1e3))
                if out.finished:
                    submit(i >= warmup)
            chunks = [(seq.kv.num_tokens - n, n) for seq, n in engine.plan if n > 1]  # (first position, tokens)
            replayed = bool(spent["forward_out"]) and spent["forward_out"][0] is not None  # None: the step ran eagerly
            layered = engine.layered_plan  # (chunks a group of layers a step, beside the decodes' graph)
            if layered is not None:
                done = layered[2] == engine.cfg.num_layers  # (then committed: their first position is n back)
                chunks += [(seq.kv.num_tokens - (n if done else 0), round(n * (layered[2] - layered[1]) /
                                                                          engine.cfg.num_layers))
                           for seq, n in layered[0]]
                kind = "layered"  # (beside decodes a group of layers; without, all that are left)
            elif not chunks:
                kind = "decode"
            elif not replayed:
                kind = "eager"
            elif spent["pieces_out"]:
                kind = "pieces"
            else:
                kind = "graph"
            if i >= warmup:
                rows.append({"kind": kind, "ms": ms, "forward_ms": spent["forward"], "compress_ms": spent["compress"],
                             "decodes": sum(n == 1 for _, n in engine.plan), "prompt_tokens": sum(n for _, n in chunks),
                             "prompt_chunks": len(chunks), "history": max((at for at, _ in chunks), default=0),
                             "layers": None if layered is None else layered[1:],  # (a layered step's first, last)
                             "compiles": compiles[0] - compiled})
    finally:
        from triton import knobs

        knobs.runtime.jit_cache_hook = None
        if profiling:
            torch.cuda.synchronize()
            profiler.stop()
        cache.compress, graphs.run, graphs._run_pieces = compress, replay, run_pieces
        for rid in list(engine.requests):
            engine.abort(rid)
    return rows, first_tokens


def summarize(rows: list[dict], first_tokens: list[tuple[str, float]]) -> dict:
    out = {}
    for kind in KINDS:
        rs = [r for r in rows if r["kind"] == kind]
        if rs:
            out[kind] = {"steps": len(rs), "ms_p50": statistics.median(r["ms"] for r in rs),
                         "ms_max": max(r["ms"] for r in rs),
                         **{f"{k}_p50": statistics.median(r[k] for r in rs)
                            for k in ("forward_ms", "compress_ms", "prompt_tokens", "prompt_chunks", "history")}}
    waits = sorted(r["ms"] for r in rows for _ in range(r["decodes"]))  # each decode row waits its step
    out["decode_wait_p50"], out["decode_wait_p99"] = waits[len(waits) // 2], waits[int(len(waits) * 0.99)]
    seconds = sum(r["ms"] for r in rows) / 1e3
    out["prompt_tok_s"], out["decode_tok_s"] = (sum(r[k] for r in rows) / seconds for k in ("prompt_tokens", "decodes"))
    out["ttft_p50_ms"] = {t: statistics.median(ms for name, ms in first_tokens if name == t)
                          for t in sorted({name for name, _ in first_tokens})}
    out["compiles"] = sum(r["compiles"] for r in rows)  # Triton compiles inside the measured steps
    return out


def kernel_table(profiler, steps: int) -> list[dict]:
    """The profiled steps' GPU time by kernel name: ms and launches a step, the most first."""
    by_name = defaultdict(lambda: [0.0, 0])
    for e in profiler.events():
        if e.device_type.name == "CUDA":
            by_name[e.name][0] += e.device_time_total / steps / 1e3
            by_name[e.name][1] += 1 / steps
    return sorted(({"kernel": k[:90], "ms_per_step": ms, "launches_per_step": n} for k, (ms, n) in by_name.items()),
                  key=lambda r: -r["ms_per_step"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", default="fp16,alrkvd-gpu,alrkvd-gpu:pieces")
    p.add_argument("--users", default="8,32")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--long", action="store_true", help="the long-context tenants and their served config")
    p.add_argument("--profile", action="store_true",
                   help="the measured steps' GPU time by kernel (torch.profiler; the steps' times include its cost)")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    result = {"device": torch.cuda.get_device_name(), "runs": []}
    for arm in a.arms.split(","):
        engine = served_engine(arm, a.long)
        engine.graphs.capture_all()
        engine.warm_up()  # as the server starts: the compiles and GEMM choices of first steps, not in the steps timed
        for users in (int(u) for u in a.users.split(",")):
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) if a.profile else None
            rows, first_tokens = run(engine, users, a.steps, a.warmup, tenants=LONG_TENANTS if a.long else TENANTS,
                                     profiler=profiler)
            s = summarize(rows, first_tokens)
            result["runs"].append({"arm": arm, "users": users, "summary": s, "steps": rows,
                                   "first_tokens": first_tokens})
            if profiler is not None:
                kernels = result["runs"][-1]["kernels"] = kernel_table(profiler, a.steps)
                print(f"{arm:18} users {users:2}: GPU {sum(k['ms_per_step'] for k in kernels):.1f} ms a step in "
                      f"{sum(k['launches_per_step'] for k in kernels):.0f} kernels; the most:", flush=True)
                for k in kernels[:12]:
                    print(f"  {k['ms_per_step']:7.2f} ms {k['launches_per_step']:6.0f}x  {k['kernel']}", flush=True)
            kinds = "; ".join(f"{k} {d['steps']}x {d['ms_p50']:.1f} ms (max {d['ms_max']:.1f}, forward "
                              f"{d['forward_ms_p50']:.1f}, compression {d['compress_ms_p50']:.1f}, "
                              f"{d['prompt_tokens_p50']:.0f} tokens in {d['prompt_chunks_p50']:.0f}, history "
                              f"{d['history_p50']:.0f})"
                              for k, d in s.items() if k in KINDS)
            ttft = ", ".join(f"{t} {ms:.0f}" for t, ms in s["ttft_p50_ms"].items())
            print(f"{arm:18} users {users:2}: decode rows wait p50 {s['decode_wait_p50']:.1f} p99 "
                  f"{s['decode_wait_p99']:.1f} ms ({s['decode_wait_p99'] / s['decode_wait_p50']:.2f}x); prompt "
                  f"tokens/s {s['prompt_tok_s']:.0f}, decodes/s {s['decode_tok_s']:.0f}; first token "
                  f"p50 ms: {ttft}; Triton compiles {s['compiles']} | {kinds}", flush=True)
        del engine
        gc.collect()
        torch.cuda.empty_cache()
        if a.out:
            a.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
