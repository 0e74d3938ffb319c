"""How fast the ALR-KVD basis can be found: the eigendecomposition of a block's per-stream Gram matrices,
the step that dominates an ALR-KVD prefill on the GPU (BENCHMARKS.md section 2, prefill).

For N Gram matrices of D x D (N = blocks x 2 kv heads; Qwen3-30B-A3B: 8 streams of 128 per block), each
row the median of 5 timed calls after a warm-up:
  cpu-eigh-f64   what ALRKVDFormat._svd does today (the Gram copied to the CPU, float64 LAPACK)
  cuda-eigh-f32 / cuda-eigh-f64   torch.linalg.eigh on the GPU
  DEV-subspace-kK    what basis_solver=subspace does: top-K directions, float64 on the device (cuda, or cpu without a GPU)
                     (backend.kv_formats.subspace_eigh: 3 steps of subspace iteration orthonormalized by
                     Cholesky QR, then a K x K Rayleigh-Ritz eigh); K = rank_max + 8
  DEV-subspace-householder-kK   the same iteration with torch.linalg.qr (Householder) instead of
                     Cholesky QR: the solver before 2026-11-30, float64

And with `--step` (GPU), what compressing the blocks of one decode step costs: every layer's block of 1, 2, 8
and 32 sequences as `PagedKVCache.commit` compresses them (Qwen3-30B-A3B's 48 layers of 4 kv heads of 128, the
served preset `alrkvd-gpu`), eagerly and as CUDA graphs (`backend.cuda_graphs.CompressGraphs`), in turns: the
host time of the call, the time to its end on the GPU, and how many synchronising CUDA calls torch's sync debug
mode sees.

    python benchmarks/bench_basis.py --out basis.json      # H200
    python benchmarks/bench_basis.py --step --out step.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from backend.kv_formats import subspace_eigh  # noqa: E402


def subspace_householder(G: torch.Tensor, k: int, seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor]:
    """subspace_eigh with torch.linalg.qr for the orthonormalization (the baseline row)."""
    n, d, _ = G.shape
    q = torch.randn(d, k, generator=torch.Generator().manual_seed(seed), dtype=G.dtype).to(G.device).expand(n, d, k)
    for _ in range(3):
        q = torch.linalg.qr(G @ q).Q
    w, u = torch.linalg.eigh(q.transpose(1, 2) @ G @ q)
    return w, q @ u


def compress_step(seqs: int, cache, graphs, rounds: int = 7) -> list[dict]:
    """One decode step's compression as `PagedKVCache.commit` runs it: every layer's block of `seqs` sequences, in
    chunks of `COMPRESS_CHUNK` blocks, through the compression kernel's call (eager) and through `graphs`
    (`CompressGraphs`: two CUDA graphs around the host's eigh), in turns. Per arm the medians of `rounds`: the
    host time of the call, the time to its end on the GPU; and how many synchronising CUDA calls torch's sync debug
    mode sees in one call."""
    import warnings
    cfg, T = cache.cfg, cache.block_size
    g = torch.Generator(device="cuda").manual_seed(seqs)
    blocks = []
    for layer in range(cfg.num_layers):
        for s in range(seqs):
            k, v = (torch.randn(T, cfg.num_kv_heads, cfg.head_dim, generator=g, device="cuda").to(cache.dtype)
                    for _ in range(2))
            blocks.append((layer, s, 4096 - T, k, v))
    arms = {"eager": cache.kernels.compress, "graphs": graphs}
    samples = {arm: [] for arm in arms}
    syncs = {}
    for arm, call in arms.items():  # a first call each: compiles, captures
        cache.compress_blocks = call
        cache.compress(blocks)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cache.compress(blocks)
        torch.cuda.set_sync_debug_mode(0)
        syncs[arm] = sum("synchroniz" in str(w.message) for w in caught)
    for _ in range(rounds):
        for arm, call in arms.items():
            cache.compress_blocks = call
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            cache.compress(blocks)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            samples[arm].append((t1 - t0, time.perf_counter() - t0))
    rows = []
    for arm in arms:
        host, total = (sorted(x)[rounds // 2] for x in zip(*samples[arm]))
        rows.append({"arm": arm, "layers": cfg.num_layers, "seqs": seqs, "blocks": len(blocks),
                     "host_ms": host * 1e3, "total_ms": total * 1e3, "syncs": syncs[arm]})
    return rows


def qwen3_cache(preset: str = "alrkvd-gpu"):
    """A paged cache of Qwen3-30B-A3B's attention (48 layers, 4 kv heads of 128, bf16) in `preset`, on CUDA,
    with the compression kernel, and its `CompressGraphs` (every size captured; prints the device memory the
    graphs and their buffers reserved)."""
    from backend.config import ModelConfig
    from backend.cuda_graphs import CompressGraphs
    from backend.kv_cache import PagedKVCache
    from backend.kv_presets import resolve_kv
    from backend.model import Rotary
    cfg = ModelConfig(model_type="qwen3_moe", vocab_size=10, hidden_size=2048, num_layers=48, num_heads=32,
                      num_kv_heads=4, head_dim=128, intermediate_size=8, rope_theta=1e6)
    kv_format, options = resolve_kv(preset)
    cache = PagedKVCache(cfg, Rotary(cfg, 8192, "cuda"), kv_format, options, 4 << 30, 32, torch.bfloat16, "cuda")
    assert cache.compress_blocks is not None, "the preset's compression has no kernel"
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    graphs = CompressGraphs(cache)
    graphs.capture_all()
    torch.cuda.synchronize()
    print(json.dumps({"compress_graphs_sizes": graphs.sizes,
                      "reserved_mb": (torch.cuda.memory_reserved() - before) / 2**20}), flush=True)
    return cache, graphs


def timed(fn, device) -> float:
    fn()
    samples = []
    for _ in range(5):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - t)
    return sorted(samples)[2]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batches", type=int, nargs="+", default=[8, 512], help="Gram matrices per call")
    p.add_argument("--ks", type=int, nargs="+", default=[24, 72], help="subspace sizes (rank_max + 8)")
    p.add_argument("--step", action="store_true", help="a decode step's compression instead (GPU)")
    a = p.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    if a.step:
        cache, graphs = qwen3_cache()
        for seqs in (1, 2, 8, 32):
            for row in compress_step(seqs, cache, graphs):
                rows.append(row)
                print(json.dumps(row), flush=True)
        a.batches = []
    for n in a.batches:
        x = torch.randn(n, 128, a.dim, device=dev)  # a block of 128 tokens per stream
        g = x.transpose(1, 2) @ x
        methods = {"cpu-eigh-f64": lambda: torch.linalg.eigh(g.double().cpu())}
        if dev == "cuda":
            methods["cuda-eigh-f32"] = lambda: torch.linalg.eigh(g)
            methods["cuda-eigh-f64"] = lambda: torch.linalg.eigh(g.double())
        g64 = g.double()
        for k in a.ks:
            methods[f"{dev}-subspace-k{k}"] = lambda k=k: subspace_eigh(g64, k, 1234)
            methods[f"{dev}-subspace-householder-k{k}"] = lambda k=k: subspace_householder(g64, k)
        for name, fn in methods.items():
            sec = timed(fn, dev)
            row = {"matrices": n, "dim": a.dim, "method": name, "ms_per_call": sec * 1e3,
                   "ms_per_matrix": sec * 1e3 / n}
            rows.append(row)
            print(f"{n:>5} x {a.dim}  {name:<20} {sec * 1e3:9.2f} ms per call  {sec * 1e3 / n:7.3f} ms per matrix",
                  flush=True)
    if a.out:
        meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                "torch": torch.__version__}
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
