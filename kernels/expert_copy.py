"""Gather rows of a tensor in pinned host memory into device rows, chosen on the device (Triton).

`cudaMemcpyAsync` needs its addresses on the host, so a CUDA graph cannot copy the experts a step
routes to: they are known only on the device. This kernel reads the host rows itself through unified
addressing (a pinned host tensor is device-accessible; Triton accepts it as a pointer argument) and
writes them where the device's bookkeeping says (backend/graph_experts.py):
    dst[dst_rows[i]] = src[src_rows[i]]   for every i with valid[i]
A fixed grid (a graph's) walks the rows and moves only the valid ones across the link.

Layout:
    src       [R, N]   pinned host memory (or device memory), contiguous
    dst       [S, N]   device memory, same dtype, contiguous
    src_rows  [n] int64, dst_rows [n] int64, valid [n] bool   on the device
Public: `copy_rows` (launcher) and `copy_rows_ref` (PyTorch). Nothing runs at import.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.tuning import num_sms


@triton.jit
def _copy_rows_kernel(
    # Pointers
    Src, Dst, Src_rows, Dst_rows, Valid,
    # Sizes
    n, row_elems,
    # Meta-parameters
    BLOCK: tl.constexpr,
):
    """Grid (G,): every program walks the n rows and copies chunks pid, pid + G, ... of each valid one, so a
    fixed grid costs little when few rows are valid (a grid of n x chunks would launch mostly idle programs)."""
    pid, num_programs = tl.program_id(0), tl.num_programs(0)
    chunks = tl.cdiv(row_elems, BLOCK)
    for i in range(0, n):
        if tl.load(Valid + i) != 0:
            src = Src + tl.load(Src_rows + i).to(tl.int64) * row_elems
            dst = Dst + tl.load(Dst_rows + i).to(tl.int64) * row_elems
            for c in range(pid, chunks, num_programs):
                offs = c * BLOCK + tl.arange(0, BLOCK)
                mask = offs < row_elems
                tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def copy_rows(src: torch.Tensor, dst: torch.Tensor, src_rows: torch.Tensor, dst_rows: torch.Tensor,
              valid: torch.Tensor, block: int = 8192, programs: int | None = None) -> None:
    """dst[dst_rows[i]] = src[src_rows[i]] where valid[i]; rows are flattened past the first dimension.
    `block` elements a chunk; `programs` (default: 4 per SM on CUDA) share each row's chunks, enough loads
    in flight to keep the link busy."""
    assert src.dtype == dst.dtype and src.is_contiguous() and dst.is_contiguous()
    assert src[0].numel() == dst[0].numel() and src_rows.shape == dst_rows.shape == valid.shape
    n, row_elems = src_rows.shape[0], src[0].numel()
    if n == 0:
        return
    programs = min(programs or 4 * num_sms(dst.device), triton.cdiv(row_elems, block))
    _copy_rows_kernel[(programs,)](src, dst, src_rows, dst_rows, valid, n, row_elems, BLOCK=block, num_warps=8)


def copy_rows_ref(src, dst, src_rows, dst_rows, valid) -> None:
    """`copy_rows` in PyTorch (any device; not capturable: the mask makes the shapes data-dependent)."""
    keep = valid.to(src_rows.device)
    dst[dst_rows[keep].to(dst.device)] = src[src_rows[keep].to(src.device)].to(dst.device)
