"""A linear layer for a decode step's few rows (Triton): `x [M, K] @ w[N, K]^T` for M up to 16.

At batch 1 the attention projections of a decode step are GEMVs that cuBLAS runs at about 40% of the H200's
bandwidth (q/k/v and the output projection with its split-K reduction: 0.96 ms of a 4.12 ms step, journal
2026-12-05 16a). Here each program streams a tile of BLOCK_N weight rows over its share of K, deep enough in flight
(num_stages) to keep the memory busy, with one tl.dot per tile (the rows padded to 16: the tensor cores idle, the
bytes are the cost). With `splits` > 1 the K range is cut in that many parts and the call returns the partial
products `[M, splits, N]` unreduced: the next RMSNorm sums them as it sums a MoE's pairs (`kernels.norms.rms_norm`
with x [T, P, N]), so the split costs no reduction launch.

    skinny_linear(x, weight, splits=1)    -> [M, N] (splits 1) or [M, splits, N] partials, in x's dtype

Reference: `x @ weight.T` in fp32. Nothing runs at import; not wired into the model until timed on the GPU
(`benchmarks/bench_skinny_gemm.py`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 16  # rows a launch takes: a tl.dot's M
_DEFAULT = {"BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4}


@triton.jit
def _skinny_gemm_kernel(X, W, Out, M, N, K, k_per_split, stride_xm, stride_wn, stride_om, stride_os,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Grid (cdiv(N, BLOCK_N), splits): rows BLOCK_N of the output, over K range [s k_per_split, (s+1) k_per_split);
    k_per_split is a multiple of BLOCK_K. Accumulates in fp32, stores in Out's dtype."""
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    k_start = pid_s * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    x_ptrs = X + offs_m[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        mask_k = k + offs_k < k_end
        w = tl.load(w_ptrs + k, mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        x = tl.load(x_ptrs + k, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    out_ptrs = Out + offs_m[:, None] * stride_om + pid_s * stride_os + offs_n[None, :]
    tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, splits: int = 1, config: dict | None = None) -> torch.Tensor:
    """`x [M, K] @ weight[N, K]^T` for M <= MAX_ROWS (row strides free, K contiguous): `[M, N]`, or with `splits`
    > 1 the partial products over that many parts of K, `[M, splits, N]` (their sum is the product). `config`:
    BLOCK_N, BLOCK_K, num_warps, num_stages (default `_DEFAULT`). No host synchronisation."""
    M, K = x.shape
    N = weight.shape[0]
    assert M <= MAX_ROWS and weight.shape[1] == K and x.stride(1) == 1 and weight.stride(1) == 1
    assert x.dtype == weight.dtype and x.device == weight.device
    cfg = dict(_DEFAULT, **(config or {}))
    block_n, block_k = cfg.pop("BLOCK_N"), cfg.pop("BLOCK_K")
    k_per_split = triton.cdiv(triton.cdiv(K, splits), block_k) * block_k
    out = torch.empty(M, splits, N, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(N, block_n), splits)
    _skinny_gemm_kernel[grid](x, weight, out, M, N, K, k_per_split, x.stride(0), weight.stride(0),
                              out.stride(0), out.stride(1), BLOCK_M=MAX_ROWS, BLOCK_N=block_n, BLOCK_K=block_k, **cfg)
    return out[:, 0] if splits == 1 else out
