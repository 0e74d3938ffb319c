"""Where a 256-token mixed step's GPU time goes (dummy Qwen3-30B-A3B, fp16 or `--kv-format`, seeded routing, B=8
decodes at 4k plus a 248-token prompt chunk, as a CUDA graph replay; ALR-KVD: graph pieces): torch.profiler's
kernel times, grouped by kernel name. `--decode`: a decode step of the B sequences instead; `--batch 0`: a prompt chunk
of `--tokens` alone (eager, as prefill runs).

    python benchmarks/profile_mixed_step.py [--batch 8] [--context 4096] [--tokens 256] [--decode] [--kv-format F]
        [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.sampling import SamplingParams  # noqa: E402
from benchmarks.bench_engine import dummy_engine  # noqa: E402
from benchmarks.bench_step_mix import kernel_table  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--decode", action="store_true", help="profile decode steps (no prompt chunk)")
    p.add_argument("--tile-rows", type=int, help="the tiles kernel's (token, head) rows (kernels.paged_attention)")
    p.add_argument("--graphs", action="store_true", help="--batch 0: the chunk replays a graph")
    p.add_argument("--kv-format", default="fp16", help="as bench_engine.py's --kv-formats (ALR-KVD: graph pieces)")
    p.add_argument("--out")
    a = p.parse_args()
    if a.tile_rows:
        import kernels.paged_attention as pa
        pa.TILE_ROWS = a.tile_rows
    graphs = bool(a.batch or a.graphs)  # mixed steps beside decodes always replay graphs
    engine = dummy_engine("qwen3-30b-a3b", a.kv_format, kv_budget_bytes=16 << 30, max_num_seqs=64,
                          cuda_graph_max_tokens=a.tokens if graphs else 0)
    cache = engine.cache

    def synthetic(prompt_len, cached, max_tokens):
        rid = engine.add_request(None, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
                                 prompt_ids=[1] * prompt_len)
        seq = engine.requests[rid]
        cache.allocate(seq.kv, cached)
        seq.kv.num_tokens = cached
        engine.waiting.remove(seq)
        engine.running.append(seq)
        return rid

    for _ in range(a.batch):
        synthetic(a.context, a.context - 1, 100)
    chunk = a.tokens - a.batch

    def mixed_step():
        rid = synthetic(a.context + chunk, a.context, 1)
        engine.step()
        engine.abort(rid)

    step = engine.step if a.decode else mixed_step
    for _ in range(3):  # captures, warms up
        step()
    wall = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
    wall_ms = sorted(wall)[2]
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    rows = kernel_table(prof, 5)
    total = sum(r["ms_per_step"] for r in rows)
    launches = sum(r["launches_per_step"] for r in rows)
    print(f"step {wall_ms:.2f} ms (median of 5, wall); GPU time per step {total:.2f} ms in {launches:.0f} kernels")
    for r in rows[:25]:
        print(f"{r['ms_per_step']:7.3f} ms {r['launches_per_step']:6.0f}x  {r['kernel']}")
    if a.out:
        Path(a.out).write_text(json.dumps({"kv_format": a.kv_format, "batch": a.batch, "context": a.context,
                                           "graphs": graphs,
                                           "tokens": a.batch if a.decode else a.tokens,
                                           "step_ms": wall_ms, "gpu_ms_per_step": total, "kernels": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
