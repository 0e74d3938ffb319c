"""Gather rows of a tensor in pinned host memory into device rows, chosen on the device (Triton).

`cudaMemcpyAsync` needs its addresses on the host, so a CUDA graph cannot copy the experts a step
routes to: they are known only on the device. This kernel reads the host rows itself through unified
addressing (a pinned host tensor is device-accessible; Triton accepts it as a pointer argument) and
writes them where the device's bookkeeping says (backend/graph_experts.py):
    dst[dst_rows[i]] = src[src_rows[i]]   for every i with valid[i]
Programs of invalid rows return at once, so a launch of a fixed size (a graph's) moves only the rows
that must cross the link.

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


@triton.jit
def _copy_rows_kernel(
    # Pointers
    Src, Dst, Src_rows, Dst_rows, Valid,
    # Sizes
    row_elems,
    # Meta-parameters
    BLOCK: tl.constexpr,
):
    """Grid (n, cdiv(row_elems, BLOCK)): program (i, j) copies elements [j*BLOCK, (j+1)*BLOCK) of row i."""
    i, j = tl.program_id(0), tl.program_id(1)
    if tl.load(Valid + i) == 0:
        return
    offs = j * BLOCK + tl.arange(0, BLOCK)
    mask = offs < row_elems
    src = Src + tl.load(Src_rows + i).to(tl.int64) * row_elems
    dst = Dst + tl.load(Dst_rows + i).to(tl.int64) * row_elems
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def copy_rows(src: torch.Tensor, dst: torch.Tensor, src_rows: torch.Tensor, dst_rows: torch.Tensor,
              valid: torch.Tensor, block: int = 8192) -> None:
    """dst[dst_rows[i]] = src[src_rows[i]] where valid[i]; rows are flattened past the first dimension.
    `block` elements per program: large enough that each program keeps many loads in flight over PCIe."""
    assert src.dtype == dst.dtype and src.is_contiguous() and dst.is_contiguous()
    assert src[0].numel() == dst[0].numel() and src_rows.shape == dst_rows.shape == valid.shape
    n, row_elems = src_rows.shape[0], src[0].numel()
    if n == 0:
        return
    grid = (n, triton.cdiv(row_elems, block))
    _copy_rows_kernel[grid](src, dst, src_rows, dst_rows, valid, row_elems, BLOCK=block, num_warps=8)


def copy_rows_ref(src, dst, src_rows, dst_rows, valid) -> None:
    """`copy_rows` in PyTorch (any device; not capturable: the mask makes the shapes data-dependent)."""
    keep = valid.to(src_rows.device)
    dst[dst_rows[keep].to(dst.device)] = src[src_rows[keep].to(src.device)].to(dst.device)
