"""The decode step's linear layers at a few rows: cuBLAS (`F.linear`) against `kernels.skinny_gemm` (whole, and split
over K with the partials left for the next norm), Qwen3-30B-A3B's shapes. Each arm runs over copies of the weight
in turn (twice the L2's bytes, as a step's 48 layers are), timed as `bench_attention.time_calls` times the attention
kernels (CUDA-graph replays); per call: microseconds and the weight bytes read per second against the device's copy
bandwidth (same run).

    python benchmarks/bench_skinny_gemm.py [--rows 1,8,16] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_attention import num_copies, time_calls  # noqa: E402
from benchmarks.devices import copy_bandwidth  # noqa: E402
from kernels.skinny_gemm import skinny_linear  # noqa: E402

SHAPES = {"qkv_proj": (5120, 2048), "o_proj": (2048, 4096), "router": (128, 2048)}  # (N, K)
CONFIGS = [{"BLOCK_N": n, "BLOCK_K": k, "num_warps": w, "num_stages": s}
           for n, k, w, s in [(16, 256, 4, 4), (32, 256, 4, 4), (32, 128, 4, 5), (64, 128, 4, 4), (16, 512, 4, 3),
                              (32, 512, 8, 3)]]
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,8,16")
    p.add_argument("--out")
    a = p.parse_args()
    bw = copy_bandwidth()
    rows = []
    for name, (n, k) in SHAPES.items():
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                   for _ in range(num_copies(n * k * 2, "cuda"))]
        for m in [int(r) for r in a.rows.split(",")]:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x, weights[0]).float()
            arms = {"cublas": lambda w: F.linear(x, w)}
            for i, cfg in enumerate(CONFIGS):
                for splits in (1, 2, 4) if name == "o_proj" else (1,):
                    arms[f"skinny c{i} s{splits}"] = lambda w, c=cfg, s=splits: skinny_linear(x, w, s, c)
            for arm, fn in arms.items():
                out = fn(weights[0]).float()
                got = out.sum(1) if out.dim() == 3 else out
                err = (got - ref).abs().max().item() / ref.abs().max().item()
                us = time_calls([lambda w=w: fn(w) for w in weights], "cuda") * 1e6
                row = {"layer": name, "rows": m, "arm": arm, "us": us, "gb_s": n * k * 2 / us / 1e3,
                       "of_copy_bw": n * k * 2 / (us * 1e-6) / bw, "max_rel_err": err}
                rows.append(row)
                print(f"{name:9} M={m:2} {arm:16} {us:7.2f} us  {row['gb_s']:6.0f} GB/s  {row['of_copy_bw']:5.0%} of "
                      f"copy  err {err:.1e}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"copy_bandwidth": bw, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
