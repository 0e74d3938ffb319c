"""The served engine under a closed loop like loadtest/tenants_gpu.yaml (chats of ~35 prompt tokens and 64 out,
summaries of 400-650 and 128 out, one to one), dummy Qwen3-30B-A3B, U users: every step timed (synchronised), with
its kind (decode only; prompt rows in one graph; a chunk across a block: graph pieces; eager), its prompt tokens, the
time the cache's block compression took (synchronised) and the forward's. Per variant and U: per kind count and ms."""
import json, os, random, statistics, sys, tempfile, time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from backend.engine import EngineArgs, LLMEngine  # noqa: E402
from backend.sampling import SamplingParams  # noqa: E402
from server.dummy_repository import SHAPES  # noqa: E402


CPU = os.environ.get("PROBE_CPU")  # a smoke run: a tiny shape on the CPU


def engine_for(kv_format, piecewise):
    folder = tempfile.mkdtemp()
    shape = dict(SHAPES["qwen3-30b-a3b"])
    if CPU:
        shape.update(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, vocab_size=50000)
    Path(folder, "config.json").write_text(json.dumps(shape))
    return LLMEngine(EngineArgs(model=folder, load_format="dummy", tokenizer="none", device="cpu" if CPU else "cuda",
                                kv_format=kv_format,
                                kv_budget_bytes=16 << 30, max_model_len=8192, max_num_seqs=32,
                                max_num_batched_tokens=2048, moe_routing="seeded", piecewise_graphs=piecewise))


def sync():
    if not CPU:
        torch.cuda.synchronize()


def run(engine, users, steps, warmup, seed=0):
    rng = random.Random(seed)
    bs = engine.cache.block_size
    spent = {"compress": 0.0, "forward": 0.0}
    compress, graphs_run = engine.cache.compress, engine.graphs and engine.graphs.run

    def timed(fn, key):
        def wrapped(*a, **k):
            sync(); t = time.perf_counter()
            out = fn(*a, **k)
            sync(); spent[key] += (time.perf_counter() - t) * 1e3
            return out
        return wrapped
    engine.cache.compress = timed(compress, "compress")
    ran_graph = []
    if engine.graphs is not None:
        inner = timed(graphs_run, "forward")

        def marked(*a, **k):
            out = inner(*a, **k)
            ran_graph.append(out is not None)
            return out
        engine.graphs.run = marked

    def submit():
        chat = rng.random() < 0.5
        n, out = (rng.randint(25, 50), 64) if chat else (rng.randint(400, 650), 128)
        engine.add_request(None, SamplingParams(max_tokens=out, temperature=0, ignore_eos=True),
                           prompt_ids=[rng.randint(100, 40000) for _ in range(n)])
    for _ in range(users):
        submit()
    rows = []
    for i in range(warmup + steps):
        spent.update(compress=0.0, forward=0.0); ran_graph.clear()
        sync(); t = time.perf_counter()
        outs = engine.step()
        sync(); ms = (time.perf_counter() - t) * 1e3
        plan = [(s.kv.num_tokens - n, n) for s, n in engine.plan]
        for o in outs:
            if o.finished:
                submit()
        prompt = [(st, n) for st, n in plan if n > 1]
        if not prompt:
            kind = "decode"
        elif not ran_graph or not ran_graph[0]:
            kind = "eager"
        elif engine.cache.windowed and any(st % bs + n > bs for st, n in prompt):
            kind = "pieces"
        else:
            kind = "graph"
        if i >= warmup:
            rows.append({"kind": kind, "ms": ms, "decodes": sum(n == 1 for _, n in plan),
                         "prompt_tokens": sum(n for _, n in prompt), "prompt_seqs": len(prompt), **spent})
    engine.cache.compress = compress
    if engine.graphs is not None:
        engine.graphs.run = graphs_run
    return rows


def summary(rows):
    out = {}
    for kind in ("decode", "graph", "pieces", "eager"):
        rs = [r for r in rows if r["kind"] == kind]
        if rs:
            q = lambda key, f=statistics.median: f([r[key] for r in rs])  # noqa: E731
            out[kind] = {"n": len(rs), "ms_p50": q("ms"), "ms_max": max(r["ms"] for r in rs),
                         "compress_p50": q("compress"), "forward_p50": q("forward"),
                         "prompt_tokens_p50": q("prompt_tokens"), "prompt_seqs_p50": q("prompt_seqs")}
    gaps = sorted(r["ms"] for r in rows for _ in range(r["decodes"]))  # each decode row's wait
    out["itl_p50"], out["itl_p99"] = gaps[len(gaps) // 2], gaps[int(len(gaps) * 0.99)]
    return out


if __name__ == "__main__":
    variants = sys.argv[1].split(",")  # fp16, alrkvd-gpu, alrkvd-gpu:whole
    out_dir = Path(sys.argv[2])
    result = {}
    for v in variants:
        fmt, _, mode = v.partition(":")
        engine = engine_for(fmt, mode != "whole")
        if engine.graphs is not None:
            engine.graphs.capture_all()
        for users, steps in ((8, 300), (32, 300)) if not CPU else ((4, 30),):
            rows = run(engine, users, steps, warmup=40 if not CPU else 5)
            s = summary(rows)
            result[f"{v} u={users}"] = {"summary": s, "rows": rows}
            line = " ".join(f"{k}:{d['n']}x p50 {d['ms_p50']:.1f} max {d['ms_max']:.1f} (cmp {d['compress_p50']:.1f}, "
                            f"fwd {d['forward_p50']:.1f}, {d['prompt_tokens_p50']:.0f} tok/{d['prompt_seqs_p50']:.0f})"
                            for k, d in s.items() if isinstance(d, dict))
            print(f"{v:18} u={users:2} itl~ p50 {s['itl_p50']:.1f} p99 {s['itl_p99']:.1f} | {line}", flush=True)
            for r in list(engine.requests):
                engine.abort(r)
        del engine
        import gc
        gc.collect()
        if not CPU:
            torch.cuda.empty_cache()
        (out_dir / "trace_steps.json").write_text(json.dumps(result))
