"""Decode attention straight from the compressed ALR-KVD paged cache (flash-decoding, Triton).

Reads only the compressed bytes of closed blocks and the full-precision window of the newest,
partial block; keys and values are rebuilt tile by tile in registers, never written to HBM.

Layout: backend/kv_formats.py `ALRKVDFormat` (latent_bits = basis_bits = 8; any k_bits/v_bits;
gauss or uniform residual codebook; with or without the residual rotation). Per layer and block
(T = block_size tokens, H kv heads, R = rank_budget rows shared by the 2H streams K0..K{H-1},
V0..V{H-1}, stream s owning rows [sum(ranks[:s]), sum(ranks[:s+1]))):
    ranks [2H] int16, basis [R, D] int8 (+ basis_scale [R] fp16),
    latent [T, R] uint8 (+ latent_scale, latent_zero [R] fp16),
    {k,v}_resid [T, H, packed(D, bits)] uint8, {k,v}_rscale (+ rzero) [T, H, D // group] fp16.
    X_hat = (latent * scale + zero) @ (basis * basis_scale) + dequant(resid) @ rot^T
Keys are stored before RoPE: the kernel rotates them (HF half-split RoPE, position = token index).
The window `[num_slots, block_size, H, D]` (model dtype, keys before RoPE) holds the last
seq_len % block_size tokens of each sequence in its slot.

Stage 1 (one program per sequence, kv head and split of the closed blocks; the extra split index
num_splits takes the window). Per block: the head's ranks/offsets, basis rows and latent scales;
then per tile of BLOCK_N tokens:
    keys:   k = lat_k @ B_k + E_k (E_k = codes -> levels * scale, then @ rot^T), both RoPE halves
            rebuilt separately, rotated with cos/sin from angle addition, scores for every query
            head of the GQA group with tl.dot;
    values: accumulated in the latent space (p @ lat_v, up-projected once per block by B_v) and
            the residual in the rotated space (p @ E_v_rot, un-rotated once per program).
Stage 2 is `kernels.paged_attention.decode_reduce` (shared with every format).

Public: `AlrkvdLayer` (the per-layer views + options), `alrkvd_decode_attention`,
`alrkvd_decode_attention_ref`. Nothing runs at import.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.paged_attention import (
    LOG2E, _group_block, attend_ref, check_decode_inputs, decode_reduce, default_num_splits, dot_dtype,
    softmax_update, store_partial,
)
from kernels.tuning import get_config

_DEFAULT_STAGE1 = {"BLOCK_N": 32, "num_warps": 8, "num_stages": 2}  # sm_90: 255 regs, ~128 B spill


@dataclass(frozen=True)
class AlrkvdLayer:
    """One layer of an ALR-KVD cache, as the kernel reads it (views; nothing copied per call).

    Shapes are per layer: the format's storage tensors indexed by the layer."""
    ranks: torch.Tensor          # [num_blocks, 2H] int16
    basis: torch.Tensor          # [num_blocks, R, D] int8
    basis_scale: torch.Tensor    # [num_blocks, R] fp16
    latent: torch.Tensor         # [num_blocks, T, R] uint8
    latent_scale: torch.Tensor   # [num_blocks, R] fp16
    latent_zero: torch.Tensor    # [num_blocks, R] fp16
    k_resid: torch.Tensor        # [num_blocks, T, H, packed(D, k_bits)] uint8
    k_rscale: torch.Tensor       # [num_blocks, T, H, D // group] fp16
    v_resid: torch.Tensor
    v_rscale: torch.Tensor
    k_rzero: torch.Tensor | None  # uniform codebook only
    v_rzero: torch.Tensor | None
    k_levels: torch.Tensor | None  # gauss codebook levels [2**k_bits] fp32
    v_levels: torch.Tensor | None
    rot_t: torch.Tensor | None   # rot^T [D, D] fp16 (None: residual not rotated)
    k_bits: int
    v_bits: int
    group: int
    rank_max: int

    @property
    def block_size(self) -> int:
        return self.latent.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.k_resid.shape[2]

    @property
    def head_dim(self) -> int:
        return self.basis.shape[2]

    @classmethod
    def from_format(cls, fmt, layer: int) -> "AlrkvdLayer":
        """Views of `backend.kv_formats.ALRKVDFormat` storage for `layer`."""
        from backend.kv_formats import gauss_codebook
        o = fmt.options
        if (o["latent_bits"] != 8 or o["basis_bits"] != 8 or o["rank_budget"] <= 0 or o.get("scale_bits", 16) != 16
                or o.get("key_frame", "pre_rope") != "pre_rope" or o.get("exact_tokens", 0)):
            raise NotImplementedError("the ALR-KVD kernel reads latent_bits=8, basis_bits=8, rank_budget>0, "
                                      "scale_bits=16, key_frame=pre_rope, exact_tokens=0")
        gauss = o["codebook"] == "gauss"
        levels = (lambda bits: gauss_codebook(bits).to(fmt.device)) if gauss else (lambda bits: None)
        rot = getattr(fmt, "_rot", None)
        return cls(
            ranks=fmt.ranks[layer], basis=fmt.basis[layer], basis_scale=fmt.basis_scale[layer],
            latent=fmt.latent[layer], latent_scale=fmt.latent_scale[layer], latent_zero=fmt.latent_zero[layer],
            k_resid=fmt.k_resid[layer], k_rscale=fmt.k_rscale[layer],
            v_resid=fmt.v_resid[layer], v_rscale=fmt.v_rscale[layer],
            k_rzero=None if gauss else fmt.k_rzero[layer], v_rzero=None if gauss else fmt.v_rzero[layer],
            k_levels=levels(o["k_bits"]), v_levels=levels(o["v_bits"]),
            rot_t=None if rot is None else rot.t().contiguous().to(torch.float16),
            k_bits=o["k_bits"], v_bits=o["v_bits"], group=o["group"], rank_max=o["rank_max"],
        )


# ----------------------------------------------------------------------------------------------
# Helpers inside the kernel
# ----------------------------------------------------------------------------------------------
@triton.jit
def _unpack_plane(row_ptrs, mask_n, BYTE0: tl.constexpr, W: tl.constexpr, COL0: tl.constexpr,
                  NCOL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Codes [BLOCK_N, NCOL] of values COL0.. of one bit plane (width W) of packed rows: value j sits
    in byte BYTE0 + j // (8 // W) at bit (j % (8 // W)) * W (backend.kv_formats.pack_bits)."""
    PER: tl.constexpr = 8 // W
    NB: tl.constexpr = NCOL // PER
    offs_b = BYTE0 + COL0 // PER + tl.arange(0, NB)
    b = tl.load(row_ptrs[:, None] + offs_b[None, :], mask=mask_n[:, None], other=0).to(tl.int32)
    shifts = tl.arange(0, PER) * W
    v = (b[:, :, None] >> shifts[None, None, :]) & ((1 << W) - 1)
    return tl.reshape(v, [BLOCK_N, NCOL])


@triton.jit
def _unpack_codes(row_ptrs, mask_n, DIM: tl.constexpr, BITS: tl.constexpr, COL0: tl.constexpr,
                  NCOL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Codes [BLOCK_N, NCOL] (int32) of values COL0..COL0+NCOL of rows packed by pack_bits over DIM
    values with BITS bits: planes of 4, 2, 1 bits (highest first), 8 bits a plain byte."""
    if BITS == 8:
        codes = _unpack_plane(row_ptrs, mask_n, 0, 8, COL0, NCOL, BLOCK_N)
    else:
        HAS4: tl.constexpr = (BITS >> 2) & 1
        HAS2: tl.constexpr = (BITS >> 1) & 1
        HAS1: tl.constexpr = BITS & 1
        codes = tl.zeros([BLOCK_N, NCOL], dtype=tl.int32)
        if HAS4:
            codes |= _unpack_plane(row_ptrs, mask_n, 0, 4, COL0, NCOL, BLOCK_N)
        if HAS2:
            codes |= _unpack_plane(row_ptrs, mask_n, HAS4 * DIM // 2, 2, COL0, NCOL, BLOCK_N) << (4 * HAS4)
        if HAS1:
            codes |= _unpack_plane(row_ptrs, mask_n, HAS4 * DIM // 2 + HAS2 * DIM // 4, 1, COL0, NCOL,
                                   BLOCK_N) << (4 * HAS4 + 2 * HAS2)
    return codes


@triton.jit
def _levels(Levels, codes, BITS: tl.constexpr):
    """Codebook lookup levels[codes]: selects for up to 4 levels, a gather beyond."""
    if BITS == 1:
        x = tl.where(codes == 0, tl.load(Levels), tl.load(Levels + 1))
    elif BITS == 2:
        lo = tl.where(codes == 0, tl.load(Levels), tl.load(Levels + 1))
        hi = tl.where(codes == 2, tl.load(Levels + 2), tl.load(Levels + 3))
        x = tl.where(codes < 2, lo, hi)
    else:
        x = tl.load(Levels + codes)
    return x


@triton.jit
def _dequant_resid(Resid, Rscale, Rzero, Levels, rows, mask_n, stride_rt, stride_st,
                   DIM: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, UNIFORM: tl.constexpr,
                   COL0: tl.constexpr, NCOL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Residual values [BLOCK_N, NCOL] (fp32, the stored, rotated domain) of columns COL0.. of the
    rows `rows` of one head: Resid/Rscale/Rzero already point at (block, head). COL0 and NCOL are
    multiples of GROUP, or the columns lie inside one group."""
    codes = _unpack_codes(Resid + rows * stride_rt, mask_n, DIM, BITS, COL0, NCOL, BLOCK_N)
    if UNIFORM:
        x = codes.to(tl.float32)
    else:
        x = _levels(Levels, codes, BITS)
    if NCOL >= GROUP:  # whole groups: one scale per (row, group), broadcast over the group
        NGS: tl.constexpr = NCOL // GROUP
        s_ptrs = rows[:, None] * stride_st + COL0 // GROUP + tl.arange(0, NGS)[None, :]
        scale = tl.load(Rscale + s_ptrs, mask=mask_n[:, None], other=0.0).to(tl.float32)
        x = tl.reshape(x, [BLOCK_N, NGS, GROUP]) * scale[:, :, None]
        if UNIFORM:
            zero = tl.load(Rzero + s_ptrs, mask=mask_n[:, None], other=0.0).to(tl.float32)
            x += zero[:, :, None]
        x = tl.reshape(x, [BLOCK_N, NCOL])
    else:  # inside one group
        s_ptrs = rows * stride_st + COL0 // GROUP
        x = x * tl.load(Rscale + s_ptrs, mask=mask_n, other=0.0).to(tl.float32)[:, None]
        if UNIFORM:
            x += tl.load(Rzero + s_ptrs, mask=mask_n, other=0.0).to(tl.float32)[:, None]
    return x


@triton.jit
def _load_rows(Ptr, rows, cols, mask_rows, mask_cols, stride_row):
    return tl.load(Ptr + rows[:, None] * stride_row + cols[None, :], mask=mask_rows[:, None] & mask_cols[None, :],
                   other=0)


@triton.jit
def _rope(x1, x2, cos, sin):
    """HF half-split RoPE: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _cos_sin(pos0, Inv_freq, Rope_j, offs_n, offs_h, HALF: tl.constexpr, BLOCK_N: tl.constexpr):
    """cos/sin [BLOCK_N, D/2] of positions pos0 + j by angle addition: one cos and one sin per
    frequency and tile, and the table Rope_j [2, BLOCK_N, D/2] of cos/sin(j * inv_freq) (L1-resident)."""
    ang0 = pos0 * tl.load(Inv_freq + offs_h)  # fp32, as fl(t * inv_freq) in the reference
    c0 = tl.cos(ang0)[None, :]
    s0 = tl.sin(ang0)[None, :]
    j_ptrs = Rope_j + offs_n[:, None] * HALF + offs_h[None, :]
    cos_j = tl.load(j_ptrs)
    sin_j = tl.load(j_ptrs + BLOCK_N * HALF)
    return c0 * cos_j - s0 * sin_j, s0 * cos_j + c0 * sin_j


# ----------------------------------------------------------------------------------------------
# Stage 1
# ----------------------------------------------------------------------------------------------
@triton.jit
def _alrkvd_decode_stage1(
    # Pointers: query, paging, window
    Q, Block_tables, Seq_lens, Window_slots, Window_k, Window_v, Inv_freq, Rope_j,
    # Pointers: compressed blocks
    Ranks, Basis, Basis_scale, Latent, Latent_scale, Latent_zero,
    K_resid, K_rscale, K_rzero, K_levels, V_resid, V_rscale, V_rzero, V_levels, Rot_t,
    # Pointers: partials
    Mid_o, Mid_lse,
    # Scalars
    qk_scale,  # softmax scale * log2(e)
    num_splits,  # programs per (sequence, kv head) over the closed blocks; grid axis 2 has one more
    # Strides
    stride_qb, stride_qh, stride_btb,
    stride_wn, stride_wt, stride_wh,  # window_k and window_v: slot, token, head (D contiguous)
    stride_rkn,  # ranks: block
    stride_bn, stride_br,  # basis: block, row
    stride_bsn,  # basis_scale, latent_scale, latent_zero: block
    stride_ln, stride_lt,  # latent: block, token
    stride_krn, stride_krt, stride_krh,  # k_resid: block, token, head
    stride_ksn, stride_kst, stride_ksh,  # k_rscale (and k_rzero): block, token, head
    stride_vrn, stride_vrt, stride_vrh,
    stride_vsn, stride_vst, stride_vsh,
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    # Meta-parameters
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,  # a power of two
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block (T)
    BLOCK_N: tl.constexpr,  # tokens per tile, divides BLOCK_SIZE
    BLOCK_R: tl.constexpr,  # >= rank_max, >= 16, a power of two
    BLOCK_S: tl.constexpr,  # >= 2 * NUM_KV_HEADS, a power of two
    K_BITS: tl.constexpr, V_BITS: tl.constexpr, RES_GROUP: tl.constexpr,
    UNIFORM: tl.constexpr, ROTATE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # fp16 (fp32 in the interpreter: see kernels.paged_attention.dot_dtype)
):
    """Grid (B, num_kv_heads, num_splits + 1): splits 0..num_splits-1 share the closed (compressed)
    blocks, split num_splits takes the window. Writes partials like `_paged_decode_stage1`."""
    HALF: tl.constexpr = HEAD_DIM // 2
    pid_b = tl.program_id(0).to(tl.int64)
    pid_kvh = tl.program_id(1)
    pid_s = tl.program_id(2)

    seq_len = tl.load(Seq_lens + pid_b)
    n_closed = seq_len // BLOCK_SIZE

    offs_g = tl.arange(0, BLOCK_G)
    offs_h = tl.arange(0, HALF)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_R)
    mask_g = offs_g < GROUP
    heads = pid_kvh * GROUP + offs_g

    # -- the group's queries, as RoPE halves
    q_row = Q + pid_b * stride_qb + heads[:, None] * stride_qh
    q1 = tl.load(q_row + offs_h[None, :], mask=mask_g[:, None], other=0.0).to(tl.float16).to(DOT_DTYPE)
    q2 = tl.load(q_row + HALF + offs_h[None, :], mask=mask_g[:, None], other=0.0).to(tl.float16).to(DOT_DTYPE)


    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)  # values, original space
    if ROTATE:
        acc_rot = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)  # value residual, rotated space

    if pid_s == num_splits:
        # ---------------- the window: full precision, keys before RoPE ----------------
        slot = tl.load(Window_slots + pid_b).to(tl.int64)
        w_off = slot * stride_wn + pid_kvh.to(tl.int64) * stride_wh
        start = n_closed * BLOCK_SIZE
        for start_n in range(start, seq_len, BLOCK_N):
            mask_n = start_n + offs_n < seq_len
            rows = (start_n - start + offs_n).to(tl.int64) * stride_wt + w_off
            k_ptrs = Window_k + rows[:, None]
            k1 = tl.load(k_ptrs + offs_h[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
            k2 = tl.load(k_ptrs + HALF + offs_h[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
            cos, sin = _cos_sin(start_n, Inv_freq, Rope_j, offs_n, offs_h, HALF, BLOCK_N)
            r1, r2 = _rope(k1, k2, cos, sin)
            s = tl.dot(q1, tl.trans(r1.to(tl.float16).to(DOT_DTYPE)))
            s += tl.dot(q2, tl.trans(r2.to(tl.float16).to(DOT_DTYPE)))
            p, alpha, m_i, l_i = softmax_update(s * qk_scale, mask_n, m_i, l_i)
            v = tl.load(Window_v + rows[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16).to(DOT_DTYPE), v.to(tl.float16).to(DOT_DTYPE))
    else:
        # ---------------- closed blocks, compressed ----------------
        blocks_per_split = tl.cdiv(n_closed, num_splits)
        blk_start = pid_s * blocks_per_split
        blk_end = tl.minimum(blk_start + blocks_per_split, n_closed)
        offs_s = tl.arange(0, BLOCK_S)
        bt_row = Block_tables + pid_b * stride_btb
        kvh64 = pid_kvh.to(tl.int64)
        for blk in range(blk_start, blk_end):
            block = tl.load(bt_row + blk).to(tl.int64)

            # -- per block: this head's K and V streams (offset and rank inside the R rows), the
            #    scales of their basis rows and latents (rows >= rank masked to 0)
            rk = tl.load(Ranks + block * stride_rkn + offs_s, mask=offs_s < 2 * NUM_KV_HEADS, other=0).to(tl.int32)
            off_k = tl.sum(tl.where(offs_s < pid_kvh, rk, 0), 0)
            r_k = tl.sum(tl.where(offs_s == pid_kvh, rk, 0), 0)
            off_v = tl.sum(tl.where(offs_s < NUM_KV_HEADS + pid_kvh, rk, 0), 0)
            r_v = tl.sum(tl.where(offs_s == NUM_KV_HEADS + pid_kvh, rk, 0), 0)
            mk = offs_r < r_k
            mv = offs_r < r_v
            sc_blk = block * stride_bsn
            basis_blk = Basis + block * stride_bn
            bk_s = tl.load(Basis_scale + sc_blk + off_k + offs_r, mask=mk, other=0.0).to(tl.float32)[:, None]
            lk_s = tl.load(Latent_scale + sc_blk + off_k + offs_r, mask=mk, other=0.0).to(tl.float32)[None, :]
            lk_z = tl.load(Latent_zero + sc_blk + off_k + offs_r, mask=mk, other=0.0).to(tl.float32)[None, :]
            lv_s = tl.load(Latent_scale + sc_blk + off_v + offs_r, mask=mv, other=0.0).to(tl.float32)[None, :]
            lv_z = tl.load(Latent_zero + sc_blk + off_v + offs_r, mask=mv, other=0.0).to(tl.float32)[None, :]
            lat_blk = Latent + block * stride_ln
            kr = K_resid + block * stride_krn + kvh64 * stride_krh
            ks_off = block * stride_ksn + kvh64 * stride_ksh
            vr = V_resid + block * stride_vrn + kvh64 * stride_vrh
            vs_off = block * stride_vsn + kvh64 * stride_vsh
            acc_blk = tl.zeros([BLOCK_G, BLOCK_R], dtype=tl.float32)  # p @ value latents, this block

            for row0 in range(0, BLOCK_SIZE, BLOCK_N):
                rows = row0 + offs_n  # token rows inside the block
                mask_n = rows < BLOCK_SIZE

                # -- keys: low-rank part per RoPE half, plus the residual back in the original space
                lk = _load_rows(lat_blk + off_k, rows, offs_r, mask_n, mk, stride_lt).to(tl.float32)
                lk = (lk * lk_s + lk_z).to(tl.float16).to(DOT_DTYPE)
                # the block's key basis, per RoPE half: reloaded per tile (L1 hits), as registers are short
                bk1 = _load_rows(basis_blk + off_k * stride_br, offs_r, offs_h, mk, offs_h < HALF, stride_br)
                bk2 = _load_rows(basis_blk + off_k * stride_br + HALF, offs_r, offs_h, mk, offs_h < HALF, stride_br)
                k1 = tl.dot(lk, (bk1.to(tl.float32) * bk_s).to(tl.float16).to(DOT_DTYPE))
                k2 = tl.dot(lk, (bk2.to(tl.float32) * bk_s).to(tl.float16).to(DOT_DTYPE))
                if ROTATE:
                    e = _dequant_resid(kr, K_rscale + ks_off, K_rzero + ks_off, K_levels, rows, mask_n,
                                       stride_krt, stride_kst, HEAD_DIM, K_BITS, RES_GROUP, UNIFORM,
                                       0, HEAD_DIM, BLOCK_N).to(tl.float16).to(DOT_DTYPE)
                    # rot^T by output RoPE half (from L1/L2: registers are short here)
                    k1 += tl.dot(e, tl.load(Rot_t + offs_d[:, None] * HEAD_DIM + offs_h[None, :]).to(DOT_DTYPE))
                    k2 += tl.dot(e, tl.load(Rot_t + offs_d[:, None] * HEAD_DIM + HALF + offs_h[None, :]).to(DOT_DTYPE))
                else:
                    k1 += _dequant_resid(kr, K_rscale + ks_off, K_rzero + ks_off, K_levels, rows, mask_n,
                                         stride_krt, stride_kst, HEAD_DIM, K_BITS, RES_GROUP, UNIFORM,
                                         0, HALF, BLOCK_N)
                    k2 += _dequant_resid(kr, K_rscale + ks_off, K_rzero + ks_off, K_levels, rows, mask_n,
                                         stride_krt, stride_kst, HEAD_DIM, K_BITS, RES_GROUP, UNIFORM,
                                         HALF, HALF, BLOCK_N)

                # -- RoPE at positions blk * T + rows, scores of every query head of the group
                cos, sin = _cos_sin(blk * BLOCK_SIZE + row0, Inv_freq, Rope_j, offs_n, offs_h, HALF, BLOCK_N)
                r1, r2 = _rope(k1, k2, cos, sin)
                s = tl.dot(q1, tl.trans(r1.to(tl.float16).to(DOT_DTYPE)))
                s += tl.dot(q2, tl.trans(r2.to(tl.float16).to(DOT_DTYPE)))
                p, alpha, m_i, l_i = softmax_update(s * qk_scale, mask_n, m_i, l_i)
                p16 = p.to(tl.float16).to(DOT_DTYPE)

                # -- values: latents accumulated per block, the residual in the rotated space
                lv = _load_rows(lat_blk + off_v, rows, offs_r, mask_n, mv, stride_lt).to(tl.float32)
                lv = tl.where(mask_n[:, None], lv * lv_s + lv_z, 0.0)
                ev = _dequant_resid(vr, V_rscale + vs_off, V_rzero + vs_off, V_levels, rows, mask_n,
                                    stride_vrt, stride_vst, HEAD_DIM, V_BITS, RES_GROUP, UNIFORM,
                                    0, HEAD_DIM, BLOCK_N)
                acc_blk = acc_blk * alpha[:, None] + tl.dot(p16, lv.to(tl.float16).to(DOT_DTYPE))
                if ROTATE:
                    acc = acc * alpha[:, None]
                    acc_rot = acc_rot * alpha[:, None] + tl.dot(p16, ev.to(tl.float16).to(DOT_DTYPE))
                else:
                    acc = acc * alpha[:, None] + tl.dot(p16, ev.to(tl.float16).to(DOT_DTYPE))

            # -- the block's value latents up-projected once by its basis
            bv_s = tl.load(Basis_scale + sc_blk + off_v + offs_r, mask=mv, other=0.0).to(tl.float32)[:, None]
            bv = _load_rows(basis_blk + off_v * stride_br, offs_r, offs_d, mv, offs_d < HEAD_DIM, stride_br)
            bv = (bv.to(tl.float32) * bv_s).to(tl.float16).to(DOT_DTYPE)
            acc += tl.dot(acc_blk.to(tl.float16).to(DOT_DTYPE), bv)

        if ROTATE:  # un-rotate the value residual once: fp16 tensor-core dots of a hi + lo split of
            #         the normalised sum (in fp16 range whatever the length)
            rot = tl.load(Rot_t + offs_d[:, None] * HEAD_DIM + offs_d[None, :]).to(DOT_DTYPE)
            l_safe = tl.where(l_i > 0, l_i, 1.0)[:, None]
            acc_rot = acc_rot / l_safe
            hi = acc_rot.to(tl.float16)
            lo = (acc_rot - hi.to(tl.float32)).to(tl.float16)
            acc += (tl.dot(hi.to(DOT_DTYPE), rot) + tl.dot(lo.to(DOT_DTYPE), rot)) * l_safe

    store_partial(Mid_o + pid_b * stride_mob + pid_s * stride_mos, Mid_lse + pid_b * stride_mlb + pid_s,
                  acc, m_i, l_i, heads, offs_d, mask_g, offs_d < HEAD_DIM, stride_moh, stride_mlh)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def _alrkvd_stage1(q, cache: AlrkvdLayer, window_k, window_v, block_tables, seq_lens, window_slots,
                   inv_freq, scale, mid_o, mid_lse):
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads, block_size = cache.num_kv_heads, cache.block_size
    num_partials = mid_o.shape[2]
    assert mid_o.shape == (batch, num_q_heads, num_partials, head_dim) and mid_o.dtype == torch.float32
    assert mid_lse.shape == (batch, num_q_heads, num_partials) and mid_lse.dtype == torch.float32
    group = num_q_heads // num_kv_heads
    cfg = get_config("alrkvd_decode_stage1",
                     f"head_dim={head_dim},group={group},block_size={block_size},k_bits={cache.k_bits}",
                     q.device, _DEFAULT_STAGE1)
    block_n = min(cfg.pop("BLOCK_N"), block_size)
    assert block_size % block_n == 0
    uniform = cache.k_levels is None
    rotate = cache.rot_t is not None
    dummy = cache.k_rscale  # stands in for absent optional tensors (never read: constexpr-disabled)
    k_rzero = cache.k_rzero if uniform else dummy
    v_rzero = cache.v_rzero if uniform else dummy
    grid = (batch, num_kv_heads, num_partials)
    # cos/sin(j * inv_freq) for the tile offsets j, as the kernel's fp32 product (angle addition)
    ang_j = torch.arange(block_n, device=q.device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    rope_j = torch.stack([ang_j.cos(), ang_j.sin()])
    _alrkvd_decode_stage1[grid](
        q, block_tables, seq_lens, window_slots, window_k, window_v, inv_freq, rope_j,
        cache.ranks, cache.basis, cache.basis_scale, cache.latent, cache.latent_scale, cache.latent_zero,
        cache.k_resid, cache.k_rscale, k_rzero, cache.k_levels if not uniform else dummy,
        cache.v_resid, cache.v_rscale, v_rzero, cache.v_levels if not uniform else dummy,
        cache.rot_t if rotate else dummy,
        mid_o, mid_lse,
        scale * LOG2E, num_partials - 1,
        q.stride(0), q.stride(1), block_tables.stride(0),
        window_k.stride(0), window_k.stride(1), window_k.stride(2),
        cache.ranks.stride(0),
        cache.basis.stride(0), cache.basis.stride(1),
        cache.basis_scale.stride(0),
        cache.latent.stride(0), cache.latent.stride(1),
        cache.k_resid.stride(0), cache.k_resid.stride(1), cache.k_resid.stride(2),
        cache.k_rscale.stride(0), cache.k_rscale.stride(1), cache.k_rscale.stride(2),
        cache.v_resid.stride(0), cache.v_resid.stride(1), cache.v_resid.stride(2),
        cache.v_rscale.stride(0), cache.v_rscale.stride(1), cache.v_rscale.stride(2),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        NUM_KV_HEADS=num_kv_heads, GROUP=group, BLOCK_G=_group_block(group), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_N=block_n,
        BLOCK_R=max(16, triton.next_power_of_2(cache.rank_max)),
        BLOCK_S=triton.next_power_of_2(2 * num_kv_heads),
        K_BITS=cache.k_bits, V_BITS=cache.v_bits, RES_GROUP=cache.group,
        UNIFORM=uniform, ROTATE=rotate,
        DOT_DTYPE=dot_dtype(torch.float16, q.device), **cfg,
    )


def _check_layer(cache: AlrkvdLayer, window_k, window_v) -> None:
    H, D, T = cache.num_kv_heads, cache.head_dim, cache.block_size
    assert D & (D - 1) == 0 and D >= 32, "head_dim must be a power of two >= 32"
    assert cache.ranks.dtype == torch.int16 and cache.basis.dtype == torch.int8
    assert cache.latent.dtype == torch.uint8 and cache.latent.shape[2] == cache.basis.shape[1]
    for t in (cache.basis, cache.latent, cache.k_resid, cache.k_rscale, cache.v_resid, cache.v_rscale,
              cache.ranks, cache.basis_scale, cache.latent_scale, cache.latent_zero):
        assert t.stride(-1) == 1
    if cache.k_rzero is not None:
        assert cache.k_rzero.stride() == cache.k_rscale.stride() and cache.v_rzero.stride() == cache.v_rscale.stride()
    if cache.rot_t is not None:
        assert cache.rot_t.shape == (D, D) and cache.rot_t.is_contiguous() and cache.rot_t.dtype == torch.float16
    assert window_k.shape[1:] == (T, H, D) and window_k.shape == window_v.shape
    assert window_k.stride() == window_v.stride() and window_k.stride(-1) == 1


def alrkvd_decode_attention(
    q: torch.Tensor,
    cache: AlrkvdLayer,
    window_k: torch.Tensor,
    window_v: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    window_slots: torch.Tensor,
    inv_freq: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Decode attention of `q [B, Hq, D]` (rotated) over an ALR-KVD layer; returns `[B, Hq, D]`.

    cache: `AlrkvdLayer.from_format(fmt, layer)`. window_k/window_v: this layer's window
    `[num_slots, block_size, Hkv, D]` (keys not rotated). block_tables `[B, max_blocks]` int32: the
    first seq_len // block_size entries are the closed blocks. seq_lens `[B]` int32: cached tokens,
    the new one included. window_slots `[B]` int32: each sequence's window slot. inv_freq `[D/2]`
    fp32 (backend.model.rope_inv_freq). num_splits: programs per (sequence, kv head) over the
    closed blocks (one more takes the window); default from the shapes. No host sync.
    """
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads, block_size = cache.num_kv_heads, cache.block_size
    check_decode_inputs(q, block_tables, seq_lens, num_kv_heads, head_dim)
    _check_layer(cache, window_k, window_v)
    assert cache.head_dim == head_dim
    assert window_slots.dtype == torch.int32 and window_slots.shape == (batch,)
    assert inv_freq.dtype == torch.float32 and inv_freq.shape == (head_dim // 2,) and inv_freq.is_contiguous()
    if num_splits is None:
        num_splits = default_num_splits(batch, num_kv_heads, block_tables.shape[1] * block_size, q.device)
    num_partials = num_splits + 1
    mid_o = torch.empty(batch, num_q_heads, num_partials, head_dim, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(batch, num_q_heads, num_partials, dtype=torch.float32, device=q.device)
    out = torch.empty(batch, num_q_heads, head_dim, dtype=q.dtype, device=q.device)
    _alrkvd_stage1(q, cache, window_k, window_v, block_tables, seq_lens, window_slots, inv_freq, scale,
                   mid_o, mid_lse)
    return decode_reduce(mid_o, mid_lse, out)


# ----------------------------------------------------------------------------------------------
# PyTorch reference
# ----------------------------------------------------------------------------------------------
def _unpack_ref(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """backend.kv_formats.unpack_bits, restated: uint8 [..., packed] -> int64 codes [..., n]."""
    p = packed.long()
    out = torch.zeros(*p.shape[:-1], n, dtype=torch.long, device=p.device)
    planes = [8] if bits == 8 else [w for w in (4, 2, 1) if bits & w]
    pos = shift = 0
    for w in planes:
        per = 8 // w
        chunk = p[..., pos:pos + n // per]
        vals = (chunk[..., None] >> (torch.arange(per, device=p.device) * w)) & ((1 << w) - 1)
        out |= vals.reshape(*p.shape[:-1], n) << shift
        pos += n // per
        shift += w
    return out


def alrkvd_decode_blocks_ref(cache: AlrkvdLayer, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 keys (not rotated) and values `[len(blocks) * T, H, D]` of closed blocks."""
    H, D, T = cache.num_kv_heads, cache.head_dim, cache.block_size
    blocks = blocks.long()
    out = []
    for kv in ("k", "v"):
        bits = getattr(cache, f"{kv}_bits")
        codes = _unpack_ref(getattr(cache, f"{kv}_resid")[blocks], bits, D)  # [n, T, H, D]
        scale = getattr(cache, f"{kv}_rscale")[blocks].float().repeat_interleave(cache.group, -1)
        levels = getattr(cache, f"{kv}_levels")
        if levels is None:
            e = codes.float() * scale + getattr(cache, f"{kv}_rzero")[blocks].float().repeat_interleave(cache.group, -1)
        else:
            e = levels[codes] * scale
        if cache.rot_t is not None:
            e = e @ cache.rot_t.float()
        out.append(e)
    e = torch.stack(out, 2)  # [n, T, 2, H, D]
    basis = cache.basis[blocks].float() * cache.basis_scale[blocks].float()[..., None]  # [n, R, D]
    lat = cache.latent[blocks].float() * cache.latent_scale[blocks].float()[:, None] \
        + cache.latent_zero[blocks].float()[:, None]  # [n, T, R]
    ranks = cache.ranks[blocks].long()  # [n, 2H]
    for i in range(blocks.numel()):
        ends = ranks[i].cumsum(0).tolist()
        for s, (a, b) in enumerate(zip([0] + ends[:-1], ends)):
            e[i, :, s // H, s % H] += lat[i, :, a:b] @ basis[i, a:b]
    e = e.flatten(0, 1)  # [n T, 2, H, D]
    return e[:, 0], e[:, 1]


def rope_ref(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """HF half-split RoPE of `x [L, H, D]` in fp32 (backend.model.Rotary without the dtype cast)."""
    ang = torch.outer(positions.float(), inv_freq.float())
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
    half = x.shape[-1] // 2
    return x.float() * cos + torch.cat([-x[..., half:], x[..., :half]], -1).float() * sin


def alrkvd_decode_attention_ref(
    q: torch.Tensor,
    cache: AlrkvdLayer,
    window_k: torch.Tensor,
    window_v: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    window_slots: torch.Tensor,
    inv_freq: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    kv_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The contract of `alrkvd_decode_attention` in fp32 PyTorch (decode blocks, RoPE, attend).
    `num_splits` is ignored; `kv_dtype` rounds the rebuilt, rotated keys and the values to that dtype
    before attending (what the kernel's fp16 tl.dot operands do), for error budgets in tests."""
    out = torch.empty_like(q)
    T = cache.block_size
    for b, seq_len in enumerate(seq_lens.tolist()):
        n_closed = seq_len // T
        k, v = alrkvd_decode_blocks_ref(cache, block_tables[b, :n_closed])
        slot = int(window_slots[b])
        k = torch.cat([k, window_k[slot, : seq_len - n_closed * T].float()])
        v = torch.cat([v, window_v[slot, : seq_len - n_closed * T].float()])
        k = rope_ref(k, torch.arange(seq_len, device=q.device), inv_freq)
        if kv_dtype is not None:
            k, v = k.to(kv_dtype), v.to(kv_dtype)
        out[b] = attend_ref(q[b], k, v, scale).to(q.dtype)
    return out
