"""How fast the ALR-KVD basis can be found: the eigendecomposition of a block's per-stream Gram matrices,
the step that dominates an ALR-KVD prefill on the GPU (BENCHMARKS.md section 2, prefill).

For N Gram matrices of D x D (N = blocks x 2 kv heads; Qwen3-30B-A3B: 8 streams of 128 per block), each
row the median of 5 timed calls after a warm-up:
  cpu-eigh-f64   what ALRKVDFormat._svd does today (the Gram copied to the CPU, float64 LAPACK)
  cuda-eigh-f32 / cuda-eigh-f64   torch.linalg.eigh on the GPU
  cuda-subspace-kK   top-K directions by subspace iteration (3 steps, QR) and a K x K Rayleigh-Ritz eigh,
                     all on the GPU in float32 (ALRKVDFormat basis_solver=subspace runs it in float64);
                     K = rank_max + 8

    python benchmarks/bench_basis.py --out basis.json      # H200
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def subspace(G: torch.Tensor, k: int, iters: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    n, d, _ = G.shape
    q = torch.randn(d, k, generator=torch.Generator().manual_seed(0), dtype=G.dtype).to(G.device).expand(n, d, k)
    for _ in range(iters):
        q, _ = torch.linalg.qr(G @ q)
    w, u = torch.linalg.eigh(q.transpose(1, 2) @ G @ q)
    return w, q @ u


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
    a = p.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for n in a.batches:
        x = torch.randn(n, 128, a.dim, device=dev)  # a block of 128 tokens per stream
        g = x.transpose(1, 2) @ x
        methods = {"cpu-eigh-f64": lambda: torch.linalg.eigh(g.double().cpu())}
        if dev == "cuda":
            methods["cuda-eigh-f32"] = lambda: torch.linalg.eigh(g)
            methods["cuda-eigh-f64"] = lambda: torch.linalg.eigh(g.double())
            for k in a.ks:
                methods[f"cuda-subspace-k{k}"] = lambda k=k: subspace(g, k)
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
