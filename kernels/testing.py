"""Helpers for the kernel tests (tests/kernels/test_*.py) and the benchmark's smoke run.

`use_interpreter_without_gpu()` must run before the first import of a kernel module: Triton decides
at `@triton.jit` time whether a kernel is compiled or interpreted (TRITON_INTERPRET=1, CPU tensors).
"""
from __future__ import annotations

import importlib
import os
import sys
from types import SimpleNamespace

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


def to_device(case: dict, device) -> dict:
    """A kernel's keyword inputs on `device`: tensors, and the tensor fields of a per-layer view dataclass
    (`cache`: AlrkvdLayer, KiviLayer)."""
    out = {}
    for name, value in case.items():
        if name == "cache":
            value = type(value)(**{f: (v.to(device) if isinstance(v := getattr(value, f), torch.Tensor) else v)
                                   for f in value.__dataclass_fields__})
        elif isinstance(value, torch.Tensor):
            value = value.to(device)
        out[name] = value
    return out


def check_decode_kernel(kernel, kernel_ref, q: torch.Tensor, scale: float, num_splits=None, **inputs):
    """A compressed-cache decode kernel against its fp32 PyTorch reference on the same inputs. Returns its
    output and {max_err_vs_ref, fp16_rounding_err, check_ok}: the error budget is twice what rounding the
    rebuilt keys and values to fp16 (the kernel's tl.dot operands) moves the reference, plus
    2e-3 x max(1, |ref|)."""
    out = kernel(q, scale=scale, num_splits=num_splits, **inputs)
    ref = kernel_ref(q, scale=scale, **inputs).float()
    ref16 = kernel_ref(q, scale=scale, kv_dtype=torch.float16, **inputs).float()
    err, e16 = (out.float() - ref).abs().max().item(), (ref16 - ref).abs().max().item()
    budget = 2 * e16 + 2e-3 * max(1.0, ref.abs().max().item())
    return out, {"max_err_vs_ref": err, "fp16_rounding_err": e16, "budget": budget, "check_ok": err <= budget}


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


def rope_tables(head_dim: int, max_len: int, theta: float = 10000.0, device="cpu") -> SimpleNamespace:
    """The RoPE tables backend.model.Rotary holds (`cos`, `sin` [max_len, head_dim] fp32, HF layout), for
    a plain RoPE of base `theta` without a ModelConfig."""
    inv_freq = (1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)).float()
    ang = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    ang = torch.cat([ang, ang], -1).to(device)
    return SimpleNamespace(cos=ang.cos(), sin=ang.sin())
