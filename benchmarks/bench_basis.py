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

And with `--step` (GPU), what compressing the blocks of one decode step costs: `kernels.alrkvd_compress`
over the blocks that `seqs` sequences fill in every one of `layers` layers (Qwen3-30B-A3B's 4 kv heads of
128, blocks of 128, the kernels' options) in one call, as the cache does at commit; the host time of the
call, the time to its end on the GPU, and how many synchronising CUDA calls torch's sync debug mode sees.

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


def compress_step(layers: int, seqs: int, heads: int = 4, dim: int = 128, block: int = 128) -> dict:
    """One decode step's compression: `seqs` blocks in each of `layers` layers, in one call."""
    import warnings

    from backend.kv_formats import make_format
    from kernels.alrkvd_attention import kernel_options
    from kernels.testing import rope_tables
    fmt = make_format("alrkvd", layers, heads, dim, torch.bfloat16, "cuda", seqs, block, **kernel_options(dim))
    fmt.set_rotary(rope_tables(dim, 40960, 1e6, device="cuda"))
    n = layers * seqs
    k = torch.randn(n, block, heads, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    args = ([i // seqs for i in range(n)], [i % seqs for i in range(n)], k, v)
    call = lambda: fmt.encode_with_kernel(*args, start_pos=[32768 - block] * n)  # noqa: E731
    call()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    torch.cuda.set_sync_debug_mode(0)
    syncs = sum("synchronizing" in str(w.message) for w in caught)
    samples = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        samples.append((t1 - t0, time.perf_counter() - t0))
    host, total = sorted(samples)[2]
    return {"layers": layers, "seqs": seqs, "blocks": n, "host_ms": host * 1e3, "total_ms": total * 1e3,
            "syncs": syncs}


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
        for layers, seqs in [(1, 1), (48, 1), (48, 8), (48, 32)]:
            rows.append(compress_step(layers, seqs))
            print(json.dumps(rows[-1]), flush=True)
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
