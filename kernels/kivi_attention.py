"""Decode attention straight from the KIVI paged cache (flash-decoding, Triton).

Reads the packed codes, scales and zeros of closed blocks and the full-precision window of the newest
tokens; nothing is dequantized to HBM. Layout: backend/kv_formats/kivi.py `KIVIFormat` (group 32), per layer
and block (T = block_size tokens, H kv heads, keys after RoPE):
    k_codes [H, D, packed(T, bits)] uint8   a channel's codes along the tokens (pack_bits: token j in byte
                                            j % NB at bit (j // NB) * bits, NB = T * bits / 8)
    k_scale, k_zero [H, D, T / 32] fp16     per channel and group of 32 tokens
    v_codes [T, H, packed(D, bits)] uint8   a token's codes along the channels (channel j in byte j % NBv)
    v_scale, v_zero [T, H, D / 32] fp16     per token and group of 32 channels
    x = code * scale + zero

Stage 1 (one program per sequence, kv head and split of the closed tiles; the extra split takes the
window), per tile of 32 tokens (one key group) of a closed block:
    keys:   the tile [D, 32] rebuilt in registers (codes * scale + zero, per channel), one dot with the
            query heads of the GQA group;
    values: per group c of 32 channels (acc{c}), the tile [32, 32] rebuilt (per token a scale and zero),
            p @ v_c. (Folding the scales into the query or the weights instead cancels badly: a group's zero
            can be far larger than its values.)
Tiles are rebuilt in fp16, the dot's operand type, with one fused multiply-add: rounding the product before
adding the zero would lose what the zero cancels (`tl.fma`, which the CPU interpreter also rounds once).
A run of codes (the bits at one position of every byte) is a contiguous run of tokens (keys) or channels
(values), so a tile's codes come from one byte load, one mask and one shift. Codes become fp16 by bit
pattern: (code | 0x6400) read as fp16 is 1024 + code, less 1024 exactly. Stage 2 is
`kernels.paged_attention.decode_reduce`.

Public: `KiviLayer` (the per-layer views), `kivi_decode_attention`, `kivi_decode_attention_ref`.
Nothing runs at import.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.codecs import kivi_dequantize
from kernels.paged_attention import (
    LOG2E, MIN_TOKENS_PER_SPLIT, attend_ref, check_decode_inputs, decode_reduce, fp16_code,
    softmax_update, store_partial, windowed_num_splits,
)
from kernels.tuning import get_config

# 2 warps: faster than 4 at every shape measured on the H200 (BENCHMARKS.md section 2d)
_DEFAULT_STAGE1 = {"num_warps": 2, "num_stages": 2, "MIN_TOKENS_PER_SPLIT": 128}
GROUP = 32  # tokens per key tile = KIVI's group


@dataclass(frozen=True)
class KiviLayer:
    """One layer of a KIVI cache as the kernel reads it (views of `KIVIFormat` storage)."""
    k_codes: torch.Tensor  # [num_blocks, H, D, packed(T, bits)] uint8
    k_scale: torch.Tensor  # [num_blocks, H, D, T / 32] fp16
    k_zero: torch.Tensor
    v_codes: torch.Tensor  # [num_blocks, T, H, packed(D, bits)] uint8
    v_scale: torch.Tensor  # [num_blocks, T, H, D / 32] fp16
    v_zero: torch.Tensor
    bits: int

    @property
    def block_size(self) -> int:
        return self.v_codes.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.k_codes.shape[1]

    @property
    def head_dim(self) -> int:
        return self.k_codes.shape[2]

    @classmethod
    def from_format(cls, fmt, layer: int) -> "KiviLayer":
        """Views of `backend.kv_formats.KIVIFormat` storage for `layer`; NotImplementedError unless bits is 2 or 4
        (kivi2, kivi4: one bit plane), group is 32, head_dim is 64 or 128, and a run of codes (the bits at one position
        of every byte) holds at least a group: block_size * bits / 8 >= 32 and head_dim * bits / 8 >= 32."""
        o = fmt.options
        b = o["bits"]
        if (b not in (2, 4) or o["group"] != GROUP or fmt.head_dim not in (64, 128)
                or fmt.block_size * b < 8 * GROUP or fmt.head_dim * b < 8 * GROUP):
            raise NotImplementedError("the KIVI kernel reads bits 2 or 4, group 32, head_dim 64 or 128, "
                                      "block_size * bits and head_dim * bits >= 256")
        return cls(k_codes=fmt.k_codes[layer], k_scale=fmt.k_scale[layer], k_zero=fmt.k_zero[layer],
                   v_codes=fmt.v_codes[layer], v_scale=fmt.v_scale[layer], v_zero=fmt.v_zero[layer], bits=o["bits"])


@triton.jit
def _codes(Ptr, rows, cols, stride_row, shift, BITS: tl.constexpr):
    """fp16 codes of one run: bits shift..shift+BITS of the bytes at rows x cols (1024 + code, less 1024)."""
    b = tl.load(Ptr + rows[:, None] * stride_row + cols[None, :]).to(tl.int16)
    return fp16_code(((b >> shift) & ((1 << BITS) - 1)).to(tl.int16))  # a runtime shift widens to int32


@triton.jit
def _value_group(acc, alpha, p, V_codes, V_scale, V_zero, rows, c: tl.constexpr, stride_vt, stride_st,
                 BITS: tl.constexpr, NBV: tl.constexpr):
    """acc [BLOCK_G, 32] of channel group c, rescaled, + p @ values_c (rows: tokens; per token a scale and zero)."""
    ch = c * 32
    codes = _codes(V_codes + ch % NBV, rows, tl.arange(0, 32), stride_vt, (ch // NBV) * BITS, BITS)  # [32, 32]
    scale = tl.load(V_scale + rows * stride_st + c)
    zero = tl.load(V_zero + rows * stride_st + c)
    v = tl.fma(codes, scale[:, None], zero[:, None])  # fp16, one rounding: a group's zero can cancel the product
    return acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)


# (ints that vary with the batch are not specialized: outside a graph, each new combination of ==1 and
# multiple-of-16 compiled the kernel again, seconds each)
@triton.jit(do_not_specialize=["num_splits", "stride_btb", "stride_mlb", "stride_mlh"])
def _kivi_decode_stage1(
    Q, Block_tables, Seq_lens, Window_slots, Window_k, Window_v,
    K_codes, K_scale, K_zero, V_codes, V_scale, V_zero,
    Mid_o, Mid_lse,
    qk_scale,  # softmax scale * log2(e)
    num_splits,
    stride_qb, stride_qh, stride_btb,
    stride_wn, stride_wt, stride_wh,
    stride_kn, stride_kh, stride_kd,  # k_codes: block, head, channel (packed tokens contiguous)
    stride_ksn, stride_ksh, stride_ksd,  # k_scale and k_zero: block, head, channel (groups contiguous)
    stride_vn, stride_vt, stride_vh,  # v_codes: block, token, head (packed channels contiguous)
    stride_vsn, stride_vst, stride_vsh,  # v_scale and v_zero: block, token, head (groups contiguous)
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    GROUP_Q: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,  # 64 or 128
    BLOCK_SIZE: tl.constexpr,
    BITS: tl.constexpr,  # 2 or 4
):
    """Grid (B, num_kv_heads, num_splits + 1): splits 0..num_splits-1 share the closed blocks' 32-token
    tiles, split num_splits takes the window. Writes partials like `_paged_decode_stage1`."""
    TILES: tl.constexpr = BLOCK_SIZE // 32
    NBK: tl.constexpr = BLOCK_SIZE * BITS // 8  # bytes of a channel's packed tokens
    NBV: tl.constexpr = HEAD_DIM * BITS // 8  # bytes of a token's packed channels
    pid_b = tl.program_id(0).to(tl.int64)
    pid_kvh = tl.program_id(1)
    pid_s = tl.program_id(2)
    seq_len = tl.load(Seq_lens + pid_b)
    n_closed = tl.maximum(seq_len - 1, 0) // BLOCK_SIZE  # the window holds the last 1..BLOCK_SIZE tokens

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, 32)
    mask_g = offs_g < GROUP_Q
    heads = pid_kvh * GROUP_Q + offs_g
    q16 = tl.load(Q + pid_b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=mask_g[:, None],
                  other=0.0).to(tl.float16)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    o_row, lse_row = Mid_o + pid_b * stride_mob + pid_s * stride_mos, Mid_lse + pid_b * stride_mlb + pid_s
    kvh64 = pid_kvh.to(tl.int64)

    if pid_s == num_splits:
        # ---------------- the window: full precision, keys after RoPE ----------------
        acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
        slot = tl.load(Window_slots + pid_b).to(tl.int64)
        w_off = slot * stride_wn + kvh64 * stride_wh
        start = n_closed * BLOCK_SIZE
        for start_n in range(start, seq_len, 32):
            mask_n = start_n + offs_n < seq_len
            rows = (start_n - start + offs_n).to(tl.int64) * stride_wt + w_off
            k = tl.load(Window_k + rows[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0.0)
            s = tl.dot(q16, tl.trans(k.to(tl.float16)))
            p, alpha, m_i, l_i = softmax_update(s * qk_scale, mask_n, m_i, l_i)
            v = tl.load(Window_v + rows[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v.to(tl.float16))
        store_partial(o_row, lse_row, acc, m_i, l_i, heads, offs_d, mask_g, offs_d < HEAD_DIM, stride_moh, stride_mlh)
    else:
        # ---------------- closed blocks, compressed: 32-token tiles, split evenly ----------------
        n_tiles = n_closed * TILES
        tiles_per_split = tl.cdiv(n_tiles, num_splits)
        t_start = pid_s * tiles_per_split
        t_end = tl.minimum(t_start + tiles_per_split, n_tiles)
        all_n = offs_n < 32
        bt_row = Block_tables + pid_b * stride_btb
        acc0 = tl.zeros([BLOCK_G, 32], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_G, 32], dtype=tl.float32)
        if HEAD_DIM == 128:
            acc2 = tl.zeros([BLOCK_G, 32], dtype=tl.float32)
            acc3 = tl.zeros([BLOCK_G, 32], dtype=tl.float32)
        for t in range(t_start, t_end):
            block = tl.load(bt_row + t // TILES).to(tl.int64)
            tile = t % TILES
            tok = tile * 32  # first token of the tile in its block: run tok // NBK, bytes tok % NBK ..
            # -- keys [D, 32]: codes * scale + zero, per channel for this tile's group
            ks = block * stride_ksn + kvh64 * stride_ksh + offs_d * stride_ksd + tile
            k_scale = tl.load(K_scale + ks)
            k_zero = tl.load(K_zero + ks)
            kp = K_codes + block * stride_kn + kvh64 * stride_kh + tok % NBK
            codes = _codes(kp, offs_d, offs_n, stride_kd, (tok // NBK) * BITS, BITS)  # [D, 32]
            k = tl.fma(codes, k_scale[:, None], k_zero[:, None])  # fp16, one rounding (as for values)
            s = tl.dot(q16, k)
            p, alpha, m_i, l_i = softmax_update(s * qk_scale, all_n, m_i, l_i)
            # -- values, by groups of 32 channels
            rows = tok + offs_n
            vp = V_codes + block * stride_vn + kvh64 * stride_vh
            vs = block * stride_vsn + kvh64 * stride_vsh
            sp, zp = V_scale + vs, V_zero + vs
            acc0 = _value_group(acc0, alpha, p, vp, sp, zp, rows, 0, stride_vt, stride_vst, BITS, NBV)
            acc1 = _value_group(acc1, alpha, p, vp, sp, zp, rows, 1, stride_vt, stride_vst, BITS, NBV)
            if HEAD_DIM == 128:
                acc2 = _value_group(acc2, alpha, p, vp, sp, zp, rows, 2, stride_vt, stride_vst, BITS, NBV)
                acc3 = _value_group(acc3, alpha, p, vp, sp, zp, rows, 3, stride_vt, stride_vst, BITS, NBV)
        all_c = offs_n < 32
        store_partial(o_row, lse_row, acc0, m_i, l_i, heads, offs_n, mask_g, all_c, stride_moh, stride_mlh)
        store_partial(o_row, lse_row, acc1, m_i, l_i, heads, 32 + offs_n, mask_g, all_c, stride_moh, stride_mlh)
        if HEAD_DIM == 128:
            store_partial(o_row, lse_row, acc2, m_i, l_i, heads, 64 + offs_n, mask_g, all_c, stride_moh, stride_mlh)
            store_partial(o_row, lse_row, acc3, m_i, l_i, heads, 96 + offs_n, mask_g, all_c, stride_moh, stride_mlh)


def _kivi_stage1(q, cache: KiviLayer, window_k, window_v, block_tables, seq_lens, window_slots, scale, mid_o, mid_lse,
                 cfg: dict, warmup: bool = False):
    """Launches stage 1 over `mid_o.shape[2] - 1` splits (or, with `warmup`, only compiles it); returns the
    compiled kernel."""
    batch, num_q_heads, head_dim = q.shape
    group = num_q_heads // cache.num_kv_heads
    grid = (batch, cache.num_kv_heads, mid_o.shape[2])
    launch = functools.partial(_kivi_decode_stage1.warmup, grid=grid) if warmup else _kivi_decode_stage1[grid]
    return launch(
        q, block_tables, seq_lens, window_slots, window_k, window_v,
        cache.k_codes, cache.k_scale, cache.k_zero, cache.v_codes, cache.v_scale, cache.v_zero,
        mid_o, mid_lse, scale * LOG2E, mid_o.shape[2] - 1,
        q.stride(0), q.stride(1), block_tables.stride(0),
        window_k.stride(0), window_k.stride(1), window_k.stride(2),
        cache.k_codes.stride(0), cache.k_codes.stride(1), cache.k_codes.stride(2),
        cache.k_scale.stride(0), cache.k_scale.stride(1), cache.k_scale.stride(2),
        cache.v_codes.stride(0), cache.v_codes.stride(1), cache.v_codes.stride(2),
        cache.v_scale.stride(0), cache.v_scale.stride(1), cache.v_scale.stride(2),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        GROUP_Q=group, BLOCK_G=triton.next_power_of_2(group),
        HEAD_DIM=head_dim, BLOCK_SIZE=cache.block_size, BITS=cache.bits,
        **cfg,
    )


def kivi_decode_attention(
    q: torch.Tensor,
    cache: KiviLayer,
    window_k: torch.Tensor,
    window_v: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    window_slots: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Decode attention of `q [B, Hq, D]` (rotated) over a KIVI layer; returns `[B, Hq, D]`.

    cache: `KiviLayer.from_format(fmt, layer)`. window_k/window_v: this layer's window `[num_slots,
    block_size, Hkv, D]` (keys rotated). block_tables `[B, max_blocks]` int32: the first (seq_len - 1) //
    block_size entries are the closed blocks; the window holds the other 1..block_size tokens. seq_lens
    `[B]` int32: cached tokens, the new one included. window_slots `[B]` int32. No host sync."""
    batch, num_q_heads, head_dim = q.shape
    H, T = cache.num_kv_heads, cache.block_size
    check_decode_inputs(q, block_tables, seq_lens, H, head_dim)
    assert cache.head_dim == head_dim and T % GROUP == 0
    assert window_k.shape[1:] == (T, H, head_dim) and window_k.shape == window_v.shape
    assert window_k.stride() == window_v.stride() and window_k.stride(-1) == 1
    assert window_slots.dtype == torch.int32 and window_slots.shape == (batch,)
    for t in (cache.k_codes, cache.k_scale, cache.v_codes, cache.v_scale):
        assert t.stride(-1) == 1
    assert cache.k_zero.stride() == cache.k_scale.stride() and cache.v_zero.stride() == cache.v_scale.stride()
    group = num_q_heads // H
    cfg = get_config("kivi_decode_stage1", f"head_dim={head_dim},group={group},block_size={T},bits={cache.bits}",
                     q.device, _DEFAULT_STAGE1)
    min_tokens = cfg.pop("MIN_TOKENS_PER_SPLIT", MIN_TOKENS_PER_SPLIT)
    inputs = (q, cache, window_k, window_v, block_tables, seq_lens, window_slots, scale)

    def partials(n):
        return (torch.empty(batch, num_q_heads, n, head_dim, dtype=torch.float32, device=q.device),
                torch.empty(batch, num_q_heads, n, dtype=torch.float32, device=q.device))

    if num_splits is None:  # whole waves of the programs the GPU runs at once
        key = ("kivi", q.device, q.dtype, q.shape[1:], T, H, cache.bits, tuple(sorted(cfg.items())))
        num_splits = windowed_num_splits(lambda: _kivi_stage1(*inputs, *partials(3), cfg, warmup=True), key, batch, H,
                                         block_tables.shape[1], T, GROUP, min_tokens, q.device)
    mid_o, mid_lse = partials(num_splits + 1)
    _kivi_stage1(*inputs, mid_o, mid_lse, cfg)
    out = torch.empty(batch, num_q_heads, head_dim, dtype=q.dtype, device=q.device)
    return decode_reduce(mid_o, mid_lse, out)


def kivi_decode_attention_ref(q, cache: KiviLayer, window_k, window_v, block_tables, seq_lens, window_slots,
                              scale: float, num_splits: int | None = None, kv_dtype: torch.dtype | None = None):
    """The contract of `kivi_decode_attention` in fp32 PyTorch: the format's own dequantization of the closed
    blocks (`kernels.codecs.kivi_dequantize`, backend.kv_formats.KIVIFormat.dequantize), then the window, then
    attention. `kv_dtype` rounds keys and values to that dtype first (what the kernel's fp16 dot operands do), for
    error budgets in tests."""
    out = torch.empty_like(q)
    T = cache.block_size
    for i, seq_len in enumerate(seq_lens.tolist()):
        n_closed = max(seq_len - 1, 0) // T
        ids = block_tables[i, :n_closed].long()
        k, v = kivi_dequantize(cache.k_codes[ids], cache.k_scale[ids].float(), cache.k_zero[ids].float(),
                               cache.v_codes[ids], cache.v_scale[ids].float(), cache.v_zero[ids].float(),
                               cache.bits, GROUP)
        slot, rest = int(window_slots[i]), seq_len - n_closed * T
        k = torch.cat([k.float(), window_k[slot, :rest].float()])
        v = torch.cat([v.float(), window_v[slot, :rest].float()])
        if kv_dtype is not None:
            k, v = k.to(kv_dtype), v.to(kv_dtype)
        out[i] = attend_ref(q[i], k, v, scale).to(q.dtype)
    return out
