"""Helpers for the kernel tests (tests/test_kernels*.py) and the benchmark's smoke run.

`use_interpreter_without_gpu()` must run before the first import of a kernel module: Triton decides
at `@triton.jit` time whether a kernel is compiled or interpreted (TRITON_INTERPRET=1, CPU tensors).
"""
from __future__ import annotations

import importlib
import os
import sys

import torch


def use_interpreter_without_gpu() -> str:
    """Without CUDA, switch Triton to its interpreter and re-import kernel modules already imported
    compiled. Returns the device the kernels run on ("cuda" or "cpu")."""
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"
        from triton import knobs  # noqa: F401  (reads the variable on each access)
        for name in sorted(m for m in sys.modules if m.startswith("kernels.") and m != __name__):
            importlib.reload(sys.modules[name])
    return "cpu"


def random_kv(shape, dtype, generator: torch.Generator, outlier_frac: float = 0.01,
              outlier_scale: float = 20.0, channel_outliers: int = 2) -> torch.Tensor:
    """N(0, 1) data `[..., H, D]` with the outliers real keys have: a few channels per head that are
    large everywhere (`channel_outliers`), and scattered single large entries (`outlier_frac`)."""
    x = torch.randn(shape, generator=generator)
    d = shape[-1]
    if channel_outliers:
        chans = torch.randperm(d, generator=generator)[:channel_outliers]
        x[..., chans] *= outlier_scale / 4
    spikes = torch.rand(shape, generator=generator) < outlier_frac
    x = torch.where(spikes, x * outlier_scale, x)
    return x.to(dtype)


def make_block_tables(seq_lens: list[int], block_size: int, num_blocks: int,
                      generator: torch.Generator, pad_to: int | None = None) -> torch.Tensor:
    """Int32 block tables `[B, max_blocks]`: each sequence gets distinct random blocks out of
    `num_blocks`, unused entries are 0 (the kernels must never read them)."""
    need = [-(-n // block_size) for n in seq_lens]
    width = max(pad_to or 0, max(need), 1)
    assert sum(need) <= num_blocks, "not enough blocks for these lengths"
    perm = torch.randperm(num_blocks, generator=generator)
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[used:used + n].int()
        used += n
    return table
