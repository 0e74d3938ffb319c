"""Fused RMSNorm kernels (Triton): the small steps around each layer's GEMMs in one launch each.

A decode step of a 48-layer MoE is launch-bound: every RMSNorm in PyTorch is four kernels (cast to
fp32, norm, cast back, weight), and a Qwen3 attention block adds a per-head norm of q and k and
RoPE's multiplies, roll and add. These kernels keep the PyTorch path's roundings (HF's: normalize in
fp32, round to the model dtype, then multiply by the weight; RoPE's products and sum each rounded).

    rms_norm(x, weight, eps, residual=None)       x [T, N]; with residual: (x + residual, its norm);
                                                  x [T, P, N]: the sum of P rows first (a MoE's pairs)
    qk_norm_rope(qkv, ..., cos, signed_sin)       qkv [T, (Hq + 2 Hkv) D] -> q, k, k_rot (RoPE'd)

`signed_sin` is backend.model.Rotary's: rotate_half(x) * sin == roll(x, D/2) * [-sin, sin].
References: `rms_norm_ref`, `qk_norm_rope_ref`. Nothing runs at import.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(X, Residual, W, Out, Sum, N, eps, stride_x, stride_p, stride_r,
                     PARTS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per row; the row is the sum of PARTS rows (in fp32, rounded once); with a residual the
    row is x + residual (rounded), also stored in Sum."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    if PARTS > 1:
        acc = x.to(tl.float32)
        for p in range(1, PARTS):
            acc += tl.load(X + row * stride_x + p * stride_p + cols, mask=mask, other=0.0).to(tl.float32)
        x = acc.to(X.dtype.element_ty)
    if HAS_RESIDUAL:
        r = tl.load(Residual + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(Sum.dtype.element_ty)
        tl.store(Sum + row * N + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / N + eps)
    y = (xf * inv_rms).to(Out.dtype.element_ty)
    w = tl.load(W + cols, mask=mask, other=0.0)
    tl.store(Out + row * N + cols, (w.to(tl.float32) * y.to(tl.float32)).to(Out.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm of the rows of `x [T, N]` (row stride free, last dim contiguous), or of `x [T, P, N]` summed
    over P in fp32 and rounded (a MoE's unreduced pairs, `fused_moe(reduce=False)`: the sum's launch saved).
    With `residual [T, N]`: returns (x + residual, RMSNorm of that sum), the pre-norm residual stream in one
    launch."""
    T, N = x.shape[0], x.shape[-1]
    parts = x.shape[1] if x.dim() == 3 else 1
    assert x.stride(-1) == 1 and weight.is_contiguous() and weight.shape == (N,)
    out = torch.empty(T, N, dtype=x.dtype, device=x.device)
    total = torch.empty_like(out) if residual is not None else out
    if residual is not None:
        assert residual.shape == (T, N) and residual.stride(1) == 1
    _rms_norm_kernel[(T,)](x, residual if residual is not None else x, weight, out, total, N, eps,
                           x.stride(0), x.stride(1) if parts > 1 else 0,
                           residual.stride(0) if residual is not None else 0,
                           PARTS=parts, HAS_RESIDUAL=residual is not None, BLOCK_N=triton.next_power_of_2(N),
                           num_warps=8 if N >= 2048 else 4)
    return (total, out) if residual is not None else out


def rms_norm_ref(x, weight, eps, residual=None):
    """The PyTorch path (backend.model.RMSNorm), over the last dim."""
    if residual is not None:
        x = x + residual
        return x, weight * F.rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype)
    return weight * F.rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype)


@triton.jit
def _qk_norm_rope_kernel(QKV, QW, KW, Cos, SignedSin, Q, K, KRot, stride_qkv, stride_rope, eps,
                         NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, D: tl.constexpr,
                         BLOCK_H: tl.constexpr, NORM: tl.constexpr):
    """Grid (T, cdiv(Hq + Hkv, BLOCK_H)): BLOCK_H head rows of one token (a program per head row made a
    2,048-token chunk 73,728 one-warp programs). q heads -> Q; kv heads -> K (normed) and KRot."""
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, D)
    rolled = (d + D // 2) % D
    mask_h = h < NUM_Q_HEADS + NUM_KV_HEADS
    is_q = h < NUM_Q_HEADS
    row = QKV + t * stride_qkv + h[:, None] * D
    x = tl.load(row + d[None, :], mask=mask_h[:, None], other=0.0)
    x_rolled = tl.load(row + rolled[None, :], mask=mask_h[:, None], other=0.0)
    if NORM:
        xf = x.to(tl.float32)
        inv_rms = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / D + eps)
        w = tl.where(is_q[:, None], tl.load(QW + d)[None, :], tl.load(KW + d)[None, :]).to(tl.float32)
        w_rolled = tl.where(is_q[:, None], tl.load(QW + rolled)[None, :],
                            tl.load(KW + rolled)[None, :]).to(tl.float32)
        x = (w * (xf * inv_rms[:, None]).to(x.dtype).to(tl.float32)).to(x.dtype)
        x_rolled = (w_rolled * (x_rolled.to(tl.float32) * inv_rms[:, None]).to(x.dtype).to(tl.float32)).to(x.dtype)
    cos = tl.load(Cos + t * stride_rope + d).to(tl.float32)[None, :]
    signed_sin = tl.load(SignedSin + t * stride_rope + d).to(tl.float32)[None, :]
    a = (x.to(tl.float32) * cos).to(x.dtype).to(tl.float32)
    b = (x_rolled.to(tl.float32) * signed_sin).to(x.dtype).to(tl.float32)
    rotated = (a + b).to(x.dtype)
    tl.store(Q + (t * NUM_Q_HEADS + h)[:, None] * D + d[None, :], rotated, mask=(mask_h & is_q)[:, None])
    is_kv = mask_h & ~is_q
    kv_rows = (t * NUM_KV_HEADS + h - NUM_Q_HEADS)[:, None] * D + d[None, :]
    tl.store(K + kv_rows, x, mask=is_kv[:, None])
    tl.store(KRot + kv_rows, rotated, mask=is_kv[:, None])


QK_HEADS_PER_PROGRAM = 8


def qk_norm_rope(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                 q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                 cos: torch.Tensor, signed_sin: torch.Tensor):
    """From the fused projection `qkv [T, (Hq + 2 Hkv) D]`: q [T, Hq, D] normed per head (when weights
    are given, Qwen3) and rotated, k [T, Hkv, D] normed, k_rot rotated. cos, signed_sin: [T, 1, D] or
    [T, D] in qkv's dtype (`Rotary.at`). v is qkv's last Hkv * D columns, untouched."""
    T = qkv.shape[0]
    D = head_dim
    assert qkv.stride(1) == 1 and qkv.shape[1] == (num_heads + 2 * num_kv_heads) * D and D & (D - 1) == 0
    cos, signed_sin = cos.reshape(T, D), signed_sin.reshape(T, D)
    assert cos.stride(1) == 1 and signed_sin.stride() == cos.stride()
    q = torch.empty(T, num_heads, D, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(T, num_kv_heads, D, dtype=qkv.dtype, device=qkv.device)
    k_rot = torch.empty_like(k)
    norm = q_weight is not None
    heads = num_heads + num_kv_heads
    block_h = min(QK_HEADS_PER_PROGRAM, triton.next_power_of_2(heads))
    _qk_norm_rope_kernel[(T, triton.cdiv(heads, block_h))](
        qkv, q_weight if norm else qkv, k_weight if norm else qkv, cos, signed_sin, q, k, k_rot,
        qkv.stride(0), cos.stride(0), eps,
        NUM_Q_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, D=D, BLOCK_H=block_h, NORM=norm,
        num_warps=max(1, min(4, block_h * D // 256)))
    return q, k, k_rot


def qk_norm_rope_ref(qkv, num_heads, num_kv_heads, head_dim, q_weight, k_weight, eps, cos, signed_sin):
    """The PyTorch path (backend.model.Attention with per-head or no q/k norm)."""
    T, D = qkv.shape[0], head_dim
    q, k, _ = qkv.split([num_heads * D, num_kv_heads * D, num_kv_heads * D], dim=-1)
    q, k = q.reshape(T, num_heads, D), k.reshape(T, num_kv_heads, D)
    if q_weight is not None:
        q, k = rms_norm_ref(q, q_weight, eps), rms_norm_ref(k, k_weight, eps)
    cos, signed_sin = cos.reshape(T, 1, D), signed_sin.reshape(T, 1, D)
    rotate = lambda x: x * cos + x.roll(D // 2, dims=-1) * signed_sin  # noqa: E731
    return rotate(q), k, rotate(k)
