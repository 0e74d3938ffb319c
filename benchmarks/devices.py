"""Measurements of the machine the benchmarks share."""
from __future__ import annotations

import time

import torch


def copy_bandwidth(device: str = "cuda", nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, bytes read + written per second (the H200 README's definition): plain
    copies timed with events (a 1 GiB copy replayed inside a CUDA graph measured a third lower)."""
    src = torch.empty(nbytes if device == "cuda" else 1 << 24, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    if device != "cuda":
        t = time.perf_counter()
        for _ in range(10):
            dst.copy_(src)
        return 2 * src.numel() * 10 / (time.perf_counter() - t)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return 2 * src.numel() * 10 / (start.elapsed_time(end) / 1e3)
