"""Decode attention straight from the compressed ALR-KVD paged cache (flash-decoding, Triton).

Reads only the compressed bytes of closed blocks and the full-precision window of the newest,
partial block; keys and values are rebuilt tile by tile in registers, never written to HBM.

Layout: backend/kv_formats/alrkvd.py `ALRKVDFormat` with the options the kernel reads (`KERNEL_OPTIONS`:
8-bit latents and basis, fp16 residual scales, uniform residual codes without rotation, one scale
and zero per token and head (group = head_dim), keys compressed after RoPE (key_frame=rotated), or only their
residual (key_frame=post_rope)). Per layer and block
(T = block_size tokens, H kv heads, R = rank_budget rows shared by the 2H streams K0..K{H-1},
V0..V{H-1}, stream s owning rows [sum(ranks[:s]), sum(ranks[:s+1]))):
    ranks [2H] int16, basis [R, D] int8 (+ basis_scale [R] fp16),
    latent [T, R] uint8, stored stream-major ([R, T] in memory: a stream's latents are rows of T
        contiguous bytes) (+ latent_scale, latent_zero [R] fp16),
    {k,v}_resid [T, H, packed(D, bits)] uint8 (backend.kv_formats.pack_bits: run r of the codes, the bits
        at r * bits of every byte, holds columns r * D/PER .. of the row, PER = 8 // bits); k_resid stored
        head-major ([H, T, packed]: a head's tokens contiguous), v_resid too, as [H, packed, T] (a byte column's
        tokens contiguous, as the value dot pairs them),
    {k,v}_rscale and {k,v}_rzero [T, H, 1] fp16, stored head-major ([H, 1, T]: a head's tokens contiguous).
    value(t)          = (latent_t * scale + zero) @ (basis * basis_scale) + codes_t * rscale_t + rzero_t
    rotated key(t)    = (latent_t * scale + zero) @ (basis * basis_scale) + codes_t * rscale_t + rzero_t    (rotated)
                      = RoPE_t((latent_t * scale + zero) @ (basis * basis_scale)) + codes_t * ...          (post_rope)
key_frame=rotated (the default) compresses the whole key after RoPE, so the scores are (q B^T) . latent_t and
nothing is rotated in the loop. key_frame=post_rope stores the low-rank part before RoPE (where keys are more
low-rank) and rotates it in the kernel, 1.16-1.39x slower on the H200 at rank 16; the residual is after RoPE in
both, so it is added as it is (BENCHMARKS.md section 2h). The window `[num_slots, block_size, H, D]`
(model dtype, keys before RoPE) holds the last 1..block_size tokens of each sequence: a block that
fills in this step is still read from the window, so the cache compresses it after the step's forward,
with the blocks of every layer in one call (backend/kv_cache.py), instead of before each layer's attention.

Stage 1 (one program per sequence, kv head and split of the closed tiles; the extra split index
num_splits takes the window), per tile of BLOCK_N tokens of a closed block, every dot transposed: tokens (or head
dims, or ranks) on the mma's 16-row side, the GQA group on its 8-column side (BLOCK_GN >= 8 columns, the padding
zero). With the group on the 16-row side, 4 query heads padded to 16 rows cost twice the HMMA and about 500 register
copies a tile, which rebuild the padded rows of each chained accumulator and operand (BENCHMARKS.md sections 2m, 2n):
    keys:   S^T [BLOCK_N, GN] = latents (q B^T)^T + residual codes q^T (ROTATED_KEYS: the whole key compressed after
            RoPE, q B^T [R, GN] once a tile; post_rope: the basis rotated once to the tile's first position p0 (RoPE
            is a rotation per frequency pair, so RoPE_{p0 + j} = RoPE_j o RoPE_{p0}), k = latents @ basis', then
            RoPE_j with cos/sin(j * theta) held in registers for the whole loop); the residual apart: q . e_t =
            rscale_t (q . codes_t) + rzero_t sum(q), one dot per code run with the same run of query columns, so no
            per-element scale, zero or interleave; softmax over the tokens (axis 0);
    values: out^T [D, GN] += basis^T (latents^T p) (accumulated in latent space, up-projected once a tile by the
            block's basis) + codes^T (p * rscale) + rzero . p, accumulated run by run (output rows of run r in acc{r});
            the column sums over tokens that take the codes' biases off (softmax sum, sum of p * rscale, rzero . p)
            are dots too, of the value dots' own operands, added after those dots: off the tile's chain of dots and
            without a cross-warp reduction (BENCHMARKS.md section 2p).
Codes become fp16 without an int-to-float conversion: the bits of run r masked in place and OR-ed with
0x6400 read as the fp16 1024 + code * 2^(r * bits); latent bytes read as 1024 + code, basis bytes (sign bit flipped)
as 1152 + code. They go to tl.dot biased, two per instruction (inline PTX when compiled), and each bias comes off
the dot's result once per column: the power of two of a residual run off the query run (keys) or the run's
accumulator (values, at the end). The streams' scales (one fp16 per basis row), too narrow for Triton's
pipeliner, are loaded a tile ahead by hand (BENCHMARKS.md section 2j); the residual's (one per token) are streamed
by it where a thread takes 4 bytes of them (section 2o). Stage 2 runs in stage 1: the last program of a (sequence,
kv head) to finish merges the partials (`kernels.paged_attention.merge_if_last`): no second kernel, 1 us less at B=1
L=4k on the H200 (BENCHMARKS.md section 2e; the paged and KIVI kernels measured slower with it and keep
`decode_reduce`).

Tiles of query rows (`tile_starts`, a prompt chunk's rows beside decodes in a mixed step): a program takes up to TILE_Q
consecutive rows of one sequence, which share the closed blocks, and their (row, head) pairs are the columns of the
same dots (the rows laid out as heads of [rows x Hq]), each row causal in the window by its own length: a compressed
tile is unpacked once for TILE_Q rows (journal 2026-12-06 26b: 1.7x row by row after 12k tokens, but the history
rebuilt and read by flash attention 7x faster still).

In the code: `_alrkvd_decode_stage1` (the grid, a row or a tile's rows, the splits' tiles) runs `_window_partial`
(the window's program) or `_blocks_partial` (a split of the closed tiles: `_query_operands` once, then per tile
`_low_rank_scores` and `_residual_dots` for the keys, `_tile_weights` for the softmax, `_value_latents` and
`_value_runs` for the values), then `merge_if_last`. The helpers are inlined when compiled: the same code as one
function, but the line info (`-lineinfo`) that Triton gives ptxas, which can move an instruction here and there in
the schedule.

Public: `KERNEL_OPTIONS`, `kernel_options`, `AlrkvdLayer` (the per-layer views), `alrkvd_decode_attention`,
`tile_rows`, `alrkvd_decode_attention_ref`, `alrkvd_rebuild_blocks` (closed blocks to dense keys and values, for
prefill). Nothing runs at import.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.paged_attention import (
    LOG2E, MIN_TOKENS_PER_SPLIT, attend_ref, check_decode_inputs, decode_tickets, fp16_bits,
    merge_chunk, merge_if_last, softmax_update, store_partial, tile_num_splits, windowed_num_splits,
)
from kernels.tuning import get_config

# MIN_TOKENS_PER_SPLIT: the shortest split, 128 against the paged kernel's 256 (B=1 L=4k: 19 against 24 us);
# NUM_WARPS_MANY_PAIRS: the warps when batch x kv heads >= MANY_PAIRS, where long splits fill the GPU and more
# programs per SM hide each tile's latency (B=8 L=32k: 694 against 786 us; B=1 L=4k: 22.6 against 19.7 us with
# 2 warps; BENCHMARKS.md section 2d). BLOCK_N: a whole block of 128 per tile, so that its basis is converted once,
# not twice: 24% fewer instructions per token (sm_90); on the H200, rotated keys at rank 16, B=8 L=32k 214 against
# 265 us, B=32 L=32k 795 against 1,007, B=1 L=4k 13.6 against 15.8, but B=8 L=4k 55 against 47; faster at B=1 at
# every rank. BLOCK_N_MANY_PAIRS_HEAVY: the tile of the 2-warp launch for the heavier loops (rank_max > 32, or
# post_rope's rebuilt keys), which were 5-14% slower at 128 from B=8 up (BENCHMARKS.md section 2l). Register caps
# (160 at 4 warps, 168 at 2 with 64-token tiles, section 2j) were slower at 128-token tiles, and the 168 cap made
# post_rope's 2-warp loop spill. LONG_TOKENS: the 2-warp launch also where fewer pairs run but the block table
# spans this many tokens (its width: with CUDA graphs, the longest sequence a replay allows). With the transposed
# dots, at B=1 2 warps take 86.6 against 127.2 us at L=128k and 32.2 against 38.5 at 32k, about the same at 16k,
# and lose below (19.2 against 12.6 at 4k); B=2 and 4 the same way (BENCHMARKS.md section 2n). WINDOW_N(_MANY_PAIRS):
# the window's tile. At 2 warps its 128-token fp32 tiles made the whole build spill (250 bytes); at 64 it does not,
# and the window's program, last on the critical path at short contexts, takes less time: B=8 L=4k 43.8 -> 36.0 us,
# B=8 L=32k 136.9 -> 132.3 (32-token tiles: 40.1 and 138.8, one more trip to memory each). The 4-warp launch keeps
# 128, one tile (B=1 L=4k: 13.3 against 14.4 us at 64 and 20.1 at 32; BENCHMARKS.md section 2r). maxnreg caps of
# 200 and 168 (5 and 6 programs per SM, the build spilling nothing or 24 bytes) were 7-44% slower from L=32k up.
# WINDOW_TILES(_MANY_PAIRS): the window's program in tiles, for the split count (`wave_num_splits`: windows that the
# last wave cannot hold run after it). 2.5 fits the 2-warp launch on the H200: counted as a whole program, B=8 L=4k
# took 28.9 us at 7 splits (one wave with the windows) against 35.9 at 8, but B=8 L=32k 144.6 at 7 against 133.1; at
# 2.5, B=8 L=4k 36.0 -> 28.8 and L=8k 51.4 -> 45.3, the rest the same split count (BENCHMARKS.md section 2r). The
# 4-warp launch, not measured so, keeps 0.
_DEFAULT_STAGE1 = {"BLOCK_N": 128, "WINDOW_N": 128, "num_warps": 4, "num_stages": 2, "MIN_TOKENS_PER_SPLIT": 128,
                   "NUM_WARPS_MANY_PAIRS": 2, "BLOCK_N_MANY_PAIRS_HEAVY": 64, "WINDOW_N_MANY_PAIRS": 64,
                   "WINDOW_TILES": 0.0, "WINDOW_TILES_MANY_PAIRS": 2.5, "LONG_TOKENS": 16384}
MANY_PAIRS = 64
# The launch of tiles of query rows (a prompt chunk's rows beside decodes, `tile_starts`): TILE_Q rows of a sequence a
# program, their (row, head) pairs the dots' columns (TILE_Q x 8 = 64 for Qwen3's group of 8), so that a compressed
# tile is read and unpacked once for TILE_Q rows, not once per row. H100, one layer of Qwen3-30B-A3B's mixed step
# (journal 2026-12-06 26b): a 2,044-token chunk after 12,288 tokens beside 4 decodes 6.15 ms, row by row 10.51 (8
# warps 9.48, 16 rows a tile 21.3, 4 rows 7.15); a 248-token chunk after 4,096 beside 8 decodes 0.39 against 0.44.
# Rebuilding the history and flash attention over it took 0.85 and 0.37 ms: long histories go eager
# (backend/cuda_graphs.py `GRAPH_MAX_HISTORY_READS`).
# Its splits: `tile_num_splits`, of at least MIN_TOKENS_PER_SPLIT keys of the block table's width (a graph's shapes
# only), so most are empty in a short mix, and empty programs of this 255-register build still take SM slots in
# waves. One layer of the served mix's step (H100, 31 decodes and a 225-token chunk, GPU time in a graph, journal
# 2026-12-07 36a): at 256 tokens 104 us, 1,024 71, 2,048 65; histories of 4,096: 724, 571, 546; `fp16` 34 and 146.
_TILES_STAGE1 = {"TILE_Q": 8, "BLOCK_N": 64, "WINDOW_N": 64, "num_warps": 4, "num_stages": 2,
                 "MIN_TOKENS_PER_SPLIT": 2048}

# The ALRKVDFormat options this kernel reads (and group = head_dim); other options take the PyTorch path. It reads
# key_frame=post_rope too (low-rank keys before RoPE, rotated per token in the loop): 1.16-1.39x slower on the H200
# at rank 16, the same perplexity on the served preset within 0.2% (BENCHMARKS.md section 2h).
KERNEL_OPTIONS = {"latent_bits": 8, "basis_bits": 8, "scale_bits": 16, "codebook": "uniform", "rotate": False,
                  "key_frame": "rotated", "exact_tokens": 0, "v_low_tokens": 0}


def kernel_options(head_dim: int, **extra) -> dict:
    """ALRKVDFormat options for the GPU: the set this kernel reads for a model of `head_dim` (k_bits, v_bits
    in {2, 4, 8}), and the basis found on the GPU by subspace iteration over at most 16 + 8 directions (the
    exact eigh runs on the CPU, hundreds of times slower for a prefill chunk: benchmarks/bench_basis.py)."""
    return {**KERNEL_OPTIONS, "group": head_dim, "basis_solver": "subspace", "rank_max": 16, **extra}


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
    k_rscale: torch.Tensor       # [num_blocks, T, H, 1] fp16
    k_rzero: torch.Tensor        # [num_blocks, T, H, 1] fp16
    v_resid: torch.Tensor
    v_rscale: torch.Tensor
    v_rzero: torch.Tensor
    k_bits: int
    v_bits: int
    rank_max: int
    rotated_keys: bool = False   # key_frame=rotated: the whole key compressed after RoPE, no RoPE in the kernel

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
        """Views of `backend.kv_formats.ALRKVDFormat` storage for `layer`; NotImplementedError when its
        options are not `KERNEL_OPTIONS` (key_frame rotated or post_rope) with group = head_dim, k_bits and v_bits in
        {2, 4, 8}, rank_budget > 0."""
        o = fmt.options
        if (any(o[k] != v for k, v in KERNEL_OPTIONS.items() if k != "key_frame")
                or o["key_frame"] not in ("post_rope", "rotated") or o["group"] != fmt.head_dim
                or o["rank_budget"] <= 0 or o["k_bits"] not in (2, 4, 8) or o["v_bits"] not in (2, 4, 8)):
            raise NotImplementedError(f"the ALR-KVD kernel reads {KERNEL_OPTIONS} (or key_frame=post_rope), "
                                      "group=head_dim, k_bits and v_bits in {2, 4, 8}, rank_budget>0")
        return cls(
            ranks=fmt.ranks[layer], basis=fmt.basis[layer], basis_scale=fmt.basis_scale[layer],
            latent=fmt.latent[layer], latent_scale=fmt.latent_scale[layer], latent_zero=fmt.latent_zero[layer],
            k_resid=fmt.k_resid[layer], k_rscale=fmt.k_rscale[layer], k_rzero=fmt.k_rzero[layer],
            v_resid=fmt.v_resid[layer], v_rscale=fmt.v_rscale[layer], v_rzero=fmt.v_rzero[layer],
            k_bits=o["k_bits"], v_bits=o["v_bits"], rank_max=o["rank_max"], rotated_keys=o["key_frame"] == "rotated",
        )


# ----------------------------------------------------------------------------------------------
# Helpers inside the kernel
# ----------------------------------------------------------------------------------------------
def _unpack_ptx(bits: int) -> tuple[tl.constexpr, tl.constexpr]:
    """PTX for `_code_runs` (4 bytes in, 8 // bits runs out, two fp16 registers each) and its constraints."""
    runs, mask = 8 // bits, (1 << bits) - 1
    lines = [f"prmt.b32 lo, ${2 * runs}, 0, 0x4140;", f"prmt.b32 hi, ${2 * runs}, 0, 0x4342;"]
    for r in range(runs):  # lop3 immediate 0xea: (a & b) | c
        pair_mask = hex((mask << (r * bits)) * 0x10001)
        lines += [f"lop3.b32 ${2 * r}, lo, {pair_mask}, 0x64006400, 0xea;",
                  f"lop3.b32 ${2 * r + 1}, hi, {pair_mask}, 0x64006400, 0xea;"]
    return tl.constexpr("{ .reg .b32 lo, hi; " + " ".join(lines) + " }"), tl.constexpr("=r," * (2 * runs) + "r")


(_PTX_2, _ARGS_2), (_PTX_4, _ARGS_4), (_PTX_8, _ARGS_8) = map(_unpack_ptx, (2, 4, 8))


@triton.jit
def _code_runs(b, BITS: tl.constexpr, ASM: tl.constexpr):
    """The 8 // BITS runs of packed residual bytes b [n, NB] (uint8), each [n, NB] fp16 holding
    1024 + code * 2^(RUN * BITS). backend.kv_formats.pack_bits puts value j of a row in byte j % NB at bit
    (j // NB) * BITS, so the codes at bit RUN * BITS of every byte are the row's columns RUN * NB ..
    RUN * NB + NB - 1, in order: one mask per byte, no shift and no interleave. Masked in place and OR-ed
    with 0x6400 the bits read as the fp16 1024 + code * 2^(RUN * BITS), exact, without an int-to-float
    conversion; the caller takes the 1024 and the power of two off its dot's result, per row.
    ASM (compiled only): two codes per 32-bit instruction, as tl.dot wants them, packed in pairs (prmt spreads
    bytes 0, 1 and 2, 3 of a register to the low bytes of two fp16 halves, then one lop3 per run masks and ORs
    a pair); the plain path builds each code alone and packs the pairs after."""
    if ASM:
        if BITS == 2:
            return tl.inline_asm_elementwise(_PTX_2, _ARGS_2, [b], (tl.float16, tl.float16, tl.float16, tl.float16),
                                             is_pure=True, pack=4)
        elif BITS == 4:
            return tl.inline_asm_elementwise(_PTX_4, _ARGS_4, [b], (tl.float16, tl.float16), is_pure=True, pack=4)
        else:
            return (tl.inline_asm_elementwise(_PTX_8, _ARGS_8, [b], tl.float16, is_pure=True, pack=4),)
    x = b.to(tl.int16)
    if BITS == 2:
        return (fp16_bits(x & 3), fp16_bits(x & 12), fp16_bits(x & 48), fp16_bits(x & 192))
    elif BITS == 4:
        return (fp16_bits(x & 15), fp16_bits(x & 240))
    else:
        return (fp16_bits(x),)


def _bytes_ptx(signed: bool) -> tl.constexpr:
    """PTX for `_byte_code`: 4 bytes in, two fp16 registers out. prmt puts bytes 0, 1 (2, 3) of a register in the low
    bytes of two fp16 halves and 0x64 in their high bytes: 1024 + byte, one instruction per pair; int8 has its sign
    bits flipped first, all four in one xor."""
    word = "x" if signed else "$2"
    flip = "xor.b32 x, $2, 0x80808080; " if signed else ""
    return tl.constexpr(f"{{ .reg .b32 x; {flip}prmt.b32 $0, {word}, 0x64646464, 0x4140; "
                        f"prmt.b32 $1, {word}, 0x64646464, 0x4342; }}")


_PTX_U8, _PTX_S8 = _bytes_ptx(False), _bytes_ptx(True)


@triton.jit
def _byte_code(b, SIGNED: tl.constexpr, ASM: tl.constexpr):
    """Bytes b (uint8, or int8 with SIGNED) as the fp16 1024 + b (1152 + b for int8: its sign bit flipped), exact,
    without an int-to-float conversion. ASM (compiled only): two per instruction, packed in pairs as tl.dot wants
    them (`_bytes_ptx`: one prmt puts two bytes under 0x64 high bytes; int8 has its sign bits flipped by one xor
    first)."""
    if ASM:
        if SIGNED:
            return tl.inline_asm_elementwise(_PTX_S8, "=r,=r,r", [b], tl.float16, is_pure=True, pack=4)
        else:
            return tl.inline_asm_elementwise(_PTX_U8, "=r,=r,r", [b], tl.float16, is_pure=True, pack=4)
    if SIGNED:
        return fp16_bits((b.to(tl.int16) & 0xFF) ^ 0x80)
    return fp16_bits(b.to(tl.int16))


@triton.jit
def _residual_dots(K_resid, block, rows, kvh64, offs_kc, qk0, qk1, qk2, qk3, stride_krn, stride_krt, stride_krh,
                   K_BITS: tl.constexpr, ASM: tl.constexpr):
    """The key residual's codes of tile `rows` of `block` times the query, [BLOCK_N, GN]: run r of the codes arrives
    as 1024 + code * 2^(r K_BITS), its query run divided by 2^(r K_BITS)."""
    PK: tl.constexpr = 8 // K_BITS
    k_bytes = tl.load(K_resid + block * stride_krn + kvh64 * stride_krh + rows[:, None] * stride_krt
                      + offs_kc[None, :])
    kc = _code_runs(k_bytes, K_BITS, ASM)
    s_res = tl.dot(kc[0], qk0)
    if PK >= 2:
        s_res = tl.dot(kc[1], qk1, s_res)
    if PK == 4:
        s_res = tl.dot(kc[3], qk3, tl.dot(kc[2], qk2, s_res))
    return s_res


@triton.jit
def _load_2d(Ptr, rows, cols, mask_rows, mask_cols, stride_row, stride_col):
    return tl.load(Ptr + rows[:, None] * stride_row + cols[None, :] * stride_col,
                   mask=mask_rows[:, None] & mask_cols[None, :], other=0)


@triton.jit
def _rope(x1, x2, cos, sin):
    """HF half-split RoPE: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _stream_rows(rk, offs_s, offs_r, pid_kvh, NUM_KV_HEADS: tl.constexpr):
    """Where kv head pid_kvh's K and V streams sit in a block whose ranks are rk [BLOCK_S]: the first row of each
    among the block's R rows, and [BLOCK_R] masks of their ranks."""
    rk = rk.to(tl.int32)
    off_k = tl.sum(tl.where(offs_s < pid_kvh, rk, 0), 0)
    mk = offs_r < tl.sum(tl.where(offs_s == pid_kvh, rk, 0), 0)
    off_v = tl.sum(tl.where(offs_s < NUM_KV_HEADS + pid_kvh, rk, 0), 0)
    mv = offs_r < tl.sum(tl.where(offs_s == NUM_KV_HEADS + pid_kvh, rk, 0), 0)
    return off_k, mk, off_v, mv


@triton.jit
def _stream_scales(block, rk, offs_s, offs_r, pid_kvh, Basis_scale, Latent_scale, Latent_zero, stride_bsn,
                   NUM_KV_HEADS: tl.constexpr):
    """The basis scale, latent scale and latent zero of kv head pid_kvh's K and V streams in `block`, whose ranks
    are rk [BLOCK_S]: six fp16 [BLOCK_R] vectors as stored, 0 past the stream's rank."""
    off_k, mk, off_v, mv = _stream_rows(rk, offs_s, offs_r, pid_kvh, NUM_KV_HEADS)
    k_rows = block * stride_bsn + off_k + offs_r
    v_rows = block * stride_bsn + off_v + offs_r
    return (tl.load(Basis_scale + k_rows, mask=mk, other=0.0), tl.load(Latent_scale + k_rows, mask=mk, other=0.0),
            tl.load(Latent_zero + k_rows, mask=mk, other=0.0), tl.load(Basis_scale + v_rows, mask=mv, other=0.0),
            tl.load(Latent_scale + v_rows, mask=mv, other=0.0), tl.load(Latent_zero + v_rows, mask=mv, other=0.0))


# ----------------------------------------------------------------------------------------------
# Stage 1, the window: full precision, keys before RoPE
# ----------------------------------------------------------------------------------------------
@triton.jit
def _window_partial(
    # Pointers
    Q, Window_slots, Window_k, Window_v, Cos, Sin,
    o_row, lse_row,  # this program's partial (Mid_o, Mid_lse)
    # This program's sequence and kv head (its query heads and their mask), the sequence's closed blocks and length
    pid_b, pid_kvh, heads, mask_g, n_closed, seq_len, row_lens, qk_scale,
    offs_h, offs_d,  # tl.arange(0, HEAD_DIM // 2), tl.arange(0, HEAD_DIM)
    # Strides
    stride_qb, stride_qh, stride_cs, stride_wn, stride_wt, stride_wh, stride_moh, stride_mlh,
    # Meta-parameters
    BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, WINDOW_N: tl.constexpr,
    TILE_Q: tl.constexpr,
):
    """Attention of the group's queries over the window's tokens, positions n_closed * BLOCK_SIZE .. seq_len - 1
    (1 .. BLOCK_SIZE of them, in the sequence's window slot, [BLOCK_SIZE, H, D], model dtype; more, in the slots
    after it, where the caller gives the closed blocks); stores the partial. With TILE_Q > 1 the group's rows are
    a tile's query rows, each causal: its tokens are those before its own length (`row_lens` [BLOCK_G]; seq_len the
    tile's longest).
    The keys are rotated here, tile by tile; the dots keep the group on the 16-row side (tl.dot pads BLOCK_G rows
    itself)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    # the group's queries, as RoPE halves
    q_row = Q + pid_b * stride_qb + heads[:, None] * stride_qh
    q1 = tl.load(q_row + offs_h[None, :], mask=mask_g[:, None], other=0.0).to(tl.float16)
    q2 = tl.load(q_row + HALF + offs_h[None, :], mask=mask_g[:, None], other=0.0).to(tl.float16)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
    slot = tl.load(Window_slots + pid_b).to(tl.int64)
    w_off = slot * stride_wn + pid_kvh.to(tl.int64) * stride_wh
    start = n_closed * BLOCK_SIZE
    # not pipelined: the window is a few tiles (WINDOW_N), and a pipeline's buffers for its fp32 tiles took stage 1
    # from 26.6 to 75.8 KB of shared memory: 3 programs per SM instead of 4 (BENCHMARKS.md section 2i)
    offs_w = tl.arange(0, WINDOW_N)
    for start_n in tl.range(start, seq_len, WINDOW_N, num_stages=1):
        mask_n = start_n + offs_w < seq_len
        rows = (start_n - start + offs_w).to(tl.int64) * stride_wt + w_off
        k_ptrs = Window_k + rows[:, None]
        k1 = tl.load(k_ptrs + offs_h[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
        k2 = tl.load(k_ptrs + HALF + offs_h[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
        cs_off = (start_n + offs_w)[:, None] * stride_cs + offs_h[None, :]
        cos = tl.load(Cos + cs_off, mask=mask_n[:, None], other=1.0)
        sin = tl.load(Sin + cs_off, mask=mask_n[:, None], other=0.0)
        r1, r2 = _rope(k1, k2, cos, sin)
        s = tl.dot(q1, tl.trans(r1.to(tl.float16))) + tl.dot(q2, tl.trans(r2.to(tl.float16)))
        if TILE_Q > 1:  # each row sees the tokens before its own length
            s = tl.where((start_n + offs_w)[None, :] < row_lens[:, None], s, float("-inf"))
        p, alpha, m_i, l_i = softmax_update(s * qk_scale, mask_n, m_i, l_i)
        v = tl.load(Window_v + rows[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v.to(tl.float16))
    store_partial(o_row, lse_row, acc, m_i, l_i, heads, offs_d, mask_g, offs_d < HEAD_DIM, stride_moh, stride_mlh)


# ----------------------------------------------------------------------------------------------
# Stage 1, the closed blocks: compressed, every dot transposed (the group on the mma's 8-column side)
# ----------------------------------------------------------------------------------------------
@triton.jit
def _query_operands(Qt_row, mask_gn, HEAD_DIM: tl.constexpr, K_BITS: tl.constexpr):
    """The group's queries transposed, [D, GN] read from Qt_row [1, GN], as the closed tiles' dots take them:
    q1t, q2t, the RoPE halves (for q B^T); qk0 .. qk3, the residual's runs of backend.kv_formats.pack_bits (a key's
    columns come as PK runs of NK, one per code position in its bytes), run r divided by 2^(r K_BITS) (exact in
    fp16) so that the runs' dots add up in one accumulator, the runs past PK placeholders (`_residual_dots` takes
    four); k_bias, 1024 times their sum, the codes' bias in that accumulator; q_sum, the sum of q."""
    HALF: tl.constexpr = HEAD_DIM // 2
    PK: tl.constexpr = 8 // K_BITS
    NK: tl.constexpr = HEAD_DIM // PK
    offs_h = tl.arange(0, HALF)
    offs_kc = tl.arange(0, NK)
    q1t = tl.load(Qt_row + offs_h[:, None], mask=mask_gn[None, :], other=0.0).to(tl.float16)
    q2t = tl.load(Qt_row + HALF + offs_h[:, None], mask=mask_gn[None, :], other=0.0).to(tl.float16)
    qk0 = tl.load(Qt_row + offs_kc[:, None], mask=mask_gn[None, :], other=0.0).to(tl.float16)
    k_bias = tl.sum(qk0.to(tl.float32), 0)
    if PK >= 2:
        qk1 = (tl.load(Qt_row + NK + offs_kc[:, None], mask=mask_gn[None, :], other=0.0)
               * (1.0 / (1 << K_BITS))).to(tl.float16)
        k_bias += tl.sum(qk1.to(tl.float32), 0)
    if PK == 4:
        qk2 = (tl.load(Qt_row + 2 * NK + offs_kc[:, None], mask=mask_gn[None, :], other=0.0)
               * 0.0625).to(tl.float16)
        qk3 = (tl.load(Qt_row + 3 * NK + offs_kc[:, None], mask=mask_gn[None, :], other=0.0)
               * 0.015625).to(tl.float16)
        k_bias += tl.sum(qk2.to(tl.float32), 0) + tl.sum(qk3.to(tl.float32), 0)
    k_bias *= 1024.0
    if PK < 2:  # placeholders, unused
        qk1 = qk0
    if PK < 4:
        qk2, qk3 = qk0, qk0
    q_sum = tl.sum(q1t.to(tl.float32), 0) + tl.sum(q2t.to(tl.float32), 0)
    return q1t, q2t, qk0, qk1, qk2, qk3, k_bias, q_sum


@triton.jit
def _low_rank_scores(Basis_blk, Latent_blk, off_k, Cos, Sin, t, rows, offs_h, offs_r, mk, all_n, bk_s, lk_s, lk_z,
                     q1t, q2t, q_sum, cos_j, sin_j, stride_br, stride_lt, stride_lr, stride_cs,
                     HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                     ROTATED_KEYS: tl.constexpr, ASM: tl.constexpr):
    """The low-rank part of tile t's key scores, S^T [BLOCK_N, GN] = latents (q B^T)^T: the K stream's basis rows and
    latents (from row off_k of the block's, Basis_blk [R, D] int8 and Latent_blk [R, T] uint8; the latents of tokens
    `rows`), with its basis scale bk_s and latent scale and zero lk_s, lk_z ([BLOCK_R], 0 past the rank, mk).
    ROTATED_KEYS: (q B^T) . latents, nothing rotated. post_rope: the basis rotated to the tile's first position p0,
    k = latents @ basis', then RoPE_j with cos_j, sin_j (the tables' first BLOCK_N rows, held in registers)."""
    TILES: tl.constexpr = BLOCK_SIZE // BLOCK_N
    HALF: tl.constexpr = HEAD_DIM // 2
    bk1 = _load_2d(Basis_blk + off_k * stride_br, offs_r, offs_h, mk, offs_h < HALF, stride_br, 1)
    bk2 = _load_2d(Basis_blk + off_k * stride_br + HALF, offs_r, offs_h, mk, offs_h < HALF, stride_br, 1)
    lk = _load_2d(Latent_blk + off_k * stride_lr, rows, offs_r, all_n, mk, stride_lt, stride_lr)
    if ROTATED_KEYS:
        # q . (lat_t B) = lat_t . (q B^T): basis and latent codes go to tl.dot biased, as they are (fp16 by
        # bit pattern: 1152 + basis code, 1024 + latent code); each bias comes off the dot's result once per
        # column, the scales and the zero off q B^T [R, GN]. The latents count as code - 128 (centred), so
        # that the fp16 rounding of their dot's right operand moves the scores half as much as against 0..255
        # two chains of dots, not one (scaled before they add: Triton would chain an added dot)
        bks = bk_s.to(tl.float32)[:, None]
        qb = tl.dot(_byte_code(bk1, True, ASM), q1t) * bks + tl.dot(_byte_code(bk2, True, ASM), q2t) * bks \
            - 1152.0 * q_sum[None, :] * bks
        w = (qb * lk_s.to(tl.float32)[:, None]).to(tl.float16)
        s_low = tl.dot(_byte_code(lk, False, ASM), w)
        s_low += tl.sum(qb * (lk_z.to(tl.float32) + 128.0 * lk_s.to(tl.float32))[:, None]
                        - 1152.0 * w.to(tl.float32), 0)[None, :]
    else:
        # the basis rotated to the tile's first position, latents @ basis', RoPE_j
        bk1 = (_byte_code(bk1, True, ASM) - 1152.0).to(tl.float32) * bk_s.to(tl.float32)[:, None]
        bk2 = (_byte_code(bk2, True, ASM) - 1152.0).to(tl.float32) * bk_s.to(tl.float32)[:, None]
        p0_off = tl.cast((t // TILES) * BLOCK_SIZE + t % TILES * BLOCK_N, tl.int64) * stride_cs + offs_h
        b1, b2 = _rope(bk1, bk2, tl.load(Cos + p0_off)[None, :], tl.load(Sin + p0_off)[None, :])
        lk = (lk.to(tl.float32) * lk_s.to(tl.float32)[None, :] + lk_z.to(tl.float32)[None, :]).to(tl.float16)
        k1, k2 = _rope(tl.dot(lk, b1.to(tl.float16), out_dtype=tl.float16),
                       tl.dot(lk, b2.to(tl.float16), out_dtype=tl.float16), cos_j, sin_j)
        s_low = tl.dot(k1, q1t) + tl.dot(k2, q2t)
    return s_low


@triton.jit
def _tile_weights(s, all_n, m_i, l_r, v_rs, v_rz, BLOCK_R: tl.constexpr, NV: tl.constexpr):
    """Online softmax over the tile's scores s [BLOCK_N, GN] (log2 units, tokens on axis 0): the weights p16 as the
    dots take them (fp16), ps = p16 rscale for the value codes, alpha, the running max m_i and sum l_r ([R, GN],
    every row the same), and the column sums over tokens as dots of the same operands (each row of the result the
    sum): p_sum [R, GN] of the fp16 weights (as the values are weighted), ps_bias [NV, GN] the residual scales'
    bias (1024 ones . p rscale), rz_sum [NV, GN] the residual zero (rzero . p). Reduced across the warps instead,
    they were a barrier and ~150 instructions a tile on the way to the value dots."""
    BLOCK_N: tl.constexpr = s.shape[0]
    p, alpha, m_i, l_r = softmax_update(s, all_n, m_i, l_r, 0, ADD_SUM=False)
    p16 = p.to(tl.float16)
    ps = p16 * v_rs[:, None]
    p_sum = tl.dot(tl.full([BLOCK_R, BLOCK_N], 1.0, tl.float16), p16)  # [R, GN]
    l_r += p_sum
    ps_bias = 1024.0 * tl.dot(tl.full([NV, BLOCK_N], 1.0, tl.float16), ps)  # [NV, GN]
    rz_sum = tl.dot(tl.broadcast_to(v_rz[None, :], (NV, BLOCK_N)), p16)  # [NV, GN]
    return p16, ps, alpha, m_i, l_r, p_sum, ps_bias, rz_sum


@triton.jit
def _value_latents(Latent_blk, off_v, rows, offs_r, mv, all_n, p16, p_sum, bv_s, lv_s, lv_z, stride_lr, stride_lt,
                   ASM: tl.constexpr):
    """The tile's weights in the V stream's latent space, p_lat = (latents^T p) * basis scale [R, GN] (fp16, the
    right operand of the up-projection by the basis): the stream's latents from row off_v of the block's
    (Latent_blk [R, T] uint8), tokens `rows`, with its latent scale and zero lv_s, lv_z and basis scale bv_s."""
    lv = _load_2d(Latent_blk + off_v * stride_lr, offs_r, rows, mv, all_n, stride_lr, stride_lt)  # [R, N]
    # latent and basis codes go to tl.dot biased (1024 + latent code, 1152 + basis code); the biases come
    # off per column: the latents' with their zero, the basis' with the residual's zero (low_zero)
    p_lat = tl.dot(_byte_code(lv, False, ASM), p16) * lv_s.to(tl.float32)[:, None] \
        + p_sum * (lv_z.to(tl.float32) - 1024.0 * lv_s.to(tl.float32))[:, None]
    return (p_lat * bv_s.to(tl.float32)[:, None]).to(tl.float16)  # [R, GN]


@triton.jit
def _value_runs(acc0, acc1, acc2, acc3, Bv_blk, vc, ps, p_lat, low_zero, ps_bias, alpha, offs_vc, offs_r, mv,
                stride_br, V_BITS: tl.constexpr, ASM: tl.constexpr):
    """The output accumulators rescaled by alpha, plus the tile's values, transposed: out^T [D, GN] as PV = 8 // V_BITS
    runs of NV rows, acc{r} [NV, GN] holding rows r NV .. r NV + NV - 1 (acc{r} past PV: placeholders, returned as
    they are). Run r: the value codes' run vc[r] [NV, N] (1024 + code * 2^(r V_BITS), `_code_runs`) times ps, and
    the V stream's basis columns r NV .. (Bv_blk: its first row) times the weights in latent space p_lat [R, GN].
    acc{r} holds 2^(r V_BITS) times its output rows (taken off at the end), so run r's codes, as they arrive, need no
    scaling per element; its low-rank part and zero are scaled instead ([R, GN], [NV, GN]). The biases are added
    after the dots, which then start as soon as ps is in (B=8 L=32k: 141.3 us, and 147.8 added into their
    accumulators, against 145.1 with the reduction; BENCHMARKS.md section 2p)."""
    PV: tl.constexpr = 8 // V_BITS
    NV: tl.constexpr = acc0.shape[0]
    bv = _byte_code(_load_2d(Bv_blk, offs_vc, offs_r, offs_vc < NV, mv, 1, stride_br), True, ASM)
    acc0 = tl.dot(bv, p_lat, tl.dot(vc[0], ps, acc0 * alpha[None, :])) + (low_zero - ps_bias)
    if PV >= 2:
        bv = _byte_code(_load_2d(Bv_blk + NV, offs_vc, offs_r, offs_vc < NV, mv, 1, stride_br), True, ASM)
        acc1 = tl.dot(bv, (p_lat * (1 << V_BITS)).to(tl.float16),
                      tl.dot(vc[1], ps, acc1 * alpha[None, :])) + (low_zero * (1 << V_BITS) - ps_bias)
    if PV == 4:
        bv = _byte_code(_load_2d(Bv_blk + 2 * NV, offs_vc, offs_r, offs_vc < NV, mv, 1, stride_br), True, ASM)
        acc2 = tl.dot(bv, (p_lat * 16).to(tl.float16),
                      tl.dot(vc[2], ps, acc2 * alpha[None, :])) + (low_zero * 16 - ps_bias)
        bv = _byte_code(_load_2d(Bv_blk + 3 * NV, offs_vc, offs_r, offs_vc < NV, mv, 1, stride_br), True, ASM)
        acc3 = tl.dot(bv, (p_lat * 64).to(tl.float16),
                      tl.dot(vc[3], ps, acc3 * alpha[None, :])) + (low_zero * 64 - ps_bias)
    return acc0, acc1, acc2, acc3


@triton.jit
def _blocks_partial(
    # Pointers
    Q, Block_tables, Cos, Sin,
    Ranks, Basis, Basis_scale, Latent, Latent_scale, Latent_zero,
    K_resid, K_rscale, K_rzero, V_resid, V_rscale, V_rzero,
    o_row, lse_row,  # this program's partial (Mid_o, Mid_lse)
    # This program's sequence, kv head and split (tiles_per_split of the sequence's n_tiles closed tiles)
    pid_b, pid_kvh, pid_s, tiles_per_split, n_tiles, num_rows, qk_scale,
    offs_h, offs_n, offs_r,  # tl.arange(0, HEAD_DIM // 2), tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_R)
    # Strides (as `_alrkvd_decode_stage1`'s)
    stride_qb, stride_qh, stride_btb, stride_cs, stride_rkn, stride_bn, stride_br, stride_bsn,
    stride_ln, stride_lt, stride_lr, stride_krn, stride_krt, stride_krh, stride_ksn, stride_kst, stride_ksh,
    stride_vrn, stride_vrt, stride_vrh, stride_vrc, stride_vsn, stride_vst, stride_vsh,
    stride_moh, stride_mlh,
    # Meta-parameters
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_GN: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
    K_BITS: tl.constexpr, V_BITS: tl.constexpr, ROTATED_KEYS: tl.constexpr, ASM: tl.constexpr,
    TILE_Q: tl.constexpr,
):
    """Attention of the group's queries (TILE_Q > 1: of the `num_rows` query rows of a tile, the columns (row, head)
    pairs) over split pid_s's tiles (BLOCK_N tokens each) of the sequence's closed,
    compressed blocks; stores the partial. Every dot is transposed: tokens (or head dims, or ranks) on the
    mma's 16-row side, the query group on its 8-column side (BLOCK_GN >= 8 columns, the padding zero): no padded
    rows to copy around the dots."""
    HALF: tl.constexpr = HEAD_DIM // 2
    TILES: tl.constexpr = BLOCK_SIZE // BLOCK_N
    offs_gn = tl.arange(0, BLOCK_GN)
    if TILE_Q == 1:
        mask_gn = offs_gn < GROUP
        heads_n = pid_kvh * GROUP + offs_gn
    else:  # column c: row c // GP of the tile, head c % GP of the group; rows as heads of a [rows x Hq] layout
        GP: tl.constexpr = BLOCK_GN // TILE_Q
        mask_gn = (offs_gn % GP < GROUP) & (offs_gn // GP < num_rows)
        heads_n = offs_gn // GP * (NUM_KV_HEADS * GROUP) + pid_kvh * GROUP + offs_gn % GP
    qt_row = Q + pid_b * stride_qb + heads_n[None, :] * stride_qh  # [1, GN]
    t_start = pid_s * tiles_per_split
    t_end = tl.minimum(t_start + tiles_per_split, n_tiles)
    offs_s = tl.arange(0, BLOCK_S)
    bt_row = Block_tables + pid_b * stride_btb
    kvh64 = pid_kvh.to(tl.int64)
    mask_s = offs_s < 2 * NUM_KV_HEADS
    all_n = offs_n < BLOCK_N
    if not ROTATED_KEYS:
        # cos/sin(j * theta) of the token offsets j inside a tile (table rows 0..BLOCK_N-1), the same for every tile
        j_off = offs_n[:, None] * stride_cs + offs_h[None, :]
        cos_j = tl.load(Cos + j_off).to(tl.float16)
        sin_j = tl.load(Sin + j_off).to(tl.float16)
    else:  # placeholders, unused
        cos_j, sin_j = Cos, Sin
    PK: tl.constexpr = 8 // K_BITS
    NK: tl.constexpr = HEAD_DIM // PK
    PV: tl.constexpr = 8 // V_BITS
    NV: tl.constexpr = HEAD_DIM // PV
    offs_kc = tl.arange(0, NK)
    offs_vc = tl.arange(0, NV)
    q1t, q2t, qk0, qk1, qk2, qk3, k_bias, q_sum = _query_operands(qt_row, mask_gn, HEAD_DIM, K_BITS)
    m_i = tl.full([BLOCK_GN], float("-inf"), dtype=tl.float32)
    l_r = tl.zeros([BLOCK_R, BLOCK_GN], dtype=tl.float32)  # the softmax's running sum, the same in every row
    # the output, transposed, accumulates as PV runs of NV rows (`_value_runs`)
    acc0 = tl.zeros([NV, BLOCK_GN], dtype=tl.float32)
    acc1, acc2, acc3 = acc0, acc0, acc0  # placeholders past PV runs, carried through the loop as they are
    if PV >= 2:
        acc1 = tl.zeros([NV, BLOCK_GN], dtype=tl.float32)
    if PV == 4:
        acc2 = tl.zeros([NV, BLOCK_GN], dtype=tl.float32)
        acc3 = tl.zeros([NV, BLOCK_GN], dtype=tl.float32)
    # A chain of loads runs ahead of the tiles: the block id two tiles ahead, the next tile's ranks, then the
    # scales of its streams (the index clamped into the sequence's table so that the last prefetches read a
    # valid entry). Each load's address is in hand an iteration or half of one before it is issued, and its
    # value is used an iteration or half of one after; the streams' scales (one fp16 per basis row) are too
    # narrow for Triton's pipeliner, and would be waited for in every tile. With rotated keys they are loaded at
    # the end of the tile before: mid-tile, Nsight Compute found 5% of the loop's stall samples waiting on them,
    # and B=32 L=32k took 492.7 against 475.6 us (B=8 L=4k: 42.2 against 43.7); post_rope keeps them mid-tile
    # (263.2 against 277.7 us at B=8 L=32k; BENCHMARKS.md section 2q).
    last = tl.maximum(n_tiles - 1, 0)
    next_block = tl.load(bt_row + tl.minimum(t_start, last) // TILES).to(tl.int64)
    block_after = tl.load(bt_row + tl.minimum(t_start + 1, last) // TILES)  # widened where used, a tile later
    next_rk = tl.load(Ranks + next_block * stride_rkn + offs_s, mask=mask_s, other=0)
    bk_s, lk_s, lk_z, bv_s, lv_s, lv_z = _stream_scales(next_block, next_rk, offs_s, offs_r, pid_kvh, Basis_scale,
                                                        Latent_scale, Latent_zero, stride_bsn, NUM_KV_HEADS)
    # rotated keys: the key residual's dots a tile ahead, their chain beside the tile before's values (B=8 L=32k:
    # 137.9 against 140.3 us, with q B^T's two chains below; BENCHMARKS.md section 2p; the last tile's next is
    # itself again, computed and not used)
    if ROTATED_KEYS:
        s_res = _residual_dots(K_resid, next_block, (t_start % TILES) * BLOCK_N + offs_n, kvh64, offs_kc, qk0, qk1,
                               qk2, qk3, stride_krn, stride_krt, stride_krh, K_BITS, ASM)
    for t in range(t_start, t_end):
        rows = (t % TILES) * BLOCK_N + offs_n
        block = next_block
        rk = next_rk
        next_block = block_after.to(tl.int64)
        block_after = tl.load(bt_row + tl.minimum(t + 2, last) // TILES)
        next_rk = tl.load(Ranks + next_block * stride_rkn + offs_s, mask=mask_s, other=0)
        # the residual scales and zeros, one fp16 per token: where a thread takes 4 bytes of them (128-token tiles
        # at 2 warps) Triton's pipeliner streams them with the codes and reads them in the layout of their use.
        # Loaded a tile ahead by hand they were converted to it through shared memory: 8 barriers a tile more
        ks_off = block * stride_ksn + kvh64 * stride_ksh + rows * stride_kst
        vs_off = block * stride_vsn + kvh64 * stride_vsh + rows * stride_vst
        k_rs, k_rz = tl.load(K_rscale + ks_off), tl.load(K_rzero + ks_off)
        v_rs, v_rz = tl.load(V_rscale + vs_off), tl.load(V_rzero + vs_off)
        # -- this head's K and V streams: offset and rank inside the block's R rows
        off_k, mk, off_v, mv = _stream_rows(rk, offs_s, offs_r, pid_kvh, NUM_KV_HEADS)
        basis_blk = Basis + block * stride_bn
        lat_blk = Latent + block * stride_ln

        # -- keys: S^T = latents (q B^T)^T + residual codes q^T, [BLOCK_N, GN]
        s_low = _low_rank_scores(basis_blk, lat_blk, off_k, Cos, Sin, t, rows, offs_h, offs_r, mk, all_n, bk_s, lk_s,
                                 lk_z, q1t, q2t, q_sum, cos_j, sin_j, stride_br, stride_lt, stride_lr, stride_cs,
                                 HEAD_DIM, BLOCK_SIZE, BLOCK_N, ROTATED_KEYS, ASM)
        # -- key residual, codes * rscale + rzero per token: q . e = rscale (q . codes) + rzero sum(q)
        if not ROTATED_KEYS:  # in the tile: post_rope's loop spilled with them ahead (273.8 against 263.2 us)
            s_res = _residual_dots(K_resid, block, rows, kvh64, offs_kc, qk0, qk1, qk2, qk3, stride_krn, stride_krt,
                                   stride_krh, K_BITS, ASM)
        s = s_low + (s_res - k_bias[None, :]) * k_rs.to(tl.float32)[:, None] \
            + q_sum[None, :] * k_rz.to(tl.float32)[:, None]
        if not ROTATED_KEYS:  # the next tile's stream scales: the keys' replace this tile's, the values' wait
            bk_s, lk_s, lk_z, next_bv_s, next_lv_s, next_lv_z = _stream_scales(
                next_block, next_rk, offs_s, offs_r, pid_kvh, Basis_scale, Latent_scale, Latent_zero, stride_bsn,
                NUM_KV_HEADS)
        p16, ps, alpha, m_i, l_r, p_sum, ps_bias, rz_sum = _tile_weights(s * qk_scale, all_n, m_i, l_r, v_rs, v_rz,
                                                                         BLOCK_R, NV)

        # -- values, transposed: out^T [D, GN] += latents^T p (up-projected by the basis) + codes^T (p rscale)
        p_lat = _value_latents(lat_blk, off_v, rows, offs_r, mv, all_n, p16, p_sum, bv_s, lv_s, lv_z, stride_lr,
                               stride_lt, ASM)
        bv_blk = basis_blk + off_v * stride_br
        # the residual's zero less the basis codes' bias, which every output row of the up-projection carries
        low_zero = rz_sum - 1152.0 * tl.sum(p_lat.to(tl.float32), 0)[None, :]
        v_bytes = tl.load(V_resid + block * stride_vrn + kvh64 * stride_vrh + rows[None, :] * stride_vrt
                          + offs_vc[:, None] * stride_vrc)  # [NV, N]
        vc = _code_runs(v_bytes, V_BITS, ASM)
        acc0, acc1, acc2, acc3 = _value_runs(acc0, acc1, acc2, acc3, bv_blk, vc, ps, p_lat, low_zero, ps_bias, alpha,
                                             offs_vc, offs_r, mv, stride_br, V_BITS, ASM)
        if ROTATED_KEYS:  # the next tile's stream scales, and its key residual's dots
            bk_s, lk_s, lk_z, bv_s, lv_s, lv_z = _stream_scales(
                next_block, next_rk, offs_s, offs_r, pid_kvh, Basis_scale, Latent_scale, Latent_zero, stride_bsn,
                NUM_KV_HEADS)
            s_res = _residual_dots(K_resid, next_block, (tl.minimum(t + 1, last) % TILES) * BLOCK_N + offs_n,
                                   kvh64, offs_kc, qk0, qk1, qk2, qk3, stride_krn, stride_krt, stride_krh, K_BITS,
                                   ASM)
        else:
            bv_s, lv_s, lv_z = next_bv_s, next_lv_s, next_lv_z

    # output columns RUN * NV .. RUN * NV + NV - 1 are acc{RUN}, transposed back
    l_i = tl.max(l_r, 0)
    all_vc = offs_vc < NV
    store_partial(o_row, lse_row, tl.trans(acc0), m_i, l_i, heads_n, offs_vc, mask_gn, all_vc, stride_moh, stride_mlh)
    if PV >= 2:
        store_partial(o_row, lse_row, tl.trans(acc1) * (1.0 / (1 << V_BITS)), m_i, l_i, heads_n, NV + offs_vc,
                      mask_gn, all_vc, stride_moh, stride_mlh)
    if PV == 4:
        store_partial(o_row, lse_row, tl.trans(acc2) * 0.0625, m_i, l_i, heads_n, 2 * NV + offs_vc, mask_gn, all_vc,
                      stride_moh, stride_mlh)
        store_partial(o_row, lse_row, tl.trans(acc3) * 0.015625, m_i, l_i, heads_n, 3 * NV + offs_vc, mask_gn, all_vc,
                      stride_moh, stride_mlh)


# ----------------------------------------------------------------------------------------------
# Stage 1: the kernel
# ----------------------------------------------------------------------------------------------
# (ints that vary with the batch are not specialized: outside a graph, each new combination of ==1 and
# multiple-of-16 compiled the kernel again, seconds each)
@triton.jit(do_not_specialize=["num_splits", "stride_btb", "stride_mlb", "stride_mlh"])
def _alrkvd_decode_stage1(
    # Pointers: query, paging, window (Closed: each row's closed blocks, read with HAS_CLOSED)
    Q, Block_tables, Seq_lens, Closed, Window_slots, Window_k, Window_v,
    Tile_starts, Tile_counts,  # TILE_Q > 1: each tile's first row and its rows (0: an unused tile)
    Cos, Sin,  # RoPE tables [max_pos, D] (HF layout: the first half of a row is cos/sin(pos * theta))
    # Pointers: compressed blocks
    Ranks, Basis, Basis_scale, Latent, Latent_scale, Latent_zero,
    K_resid, K_rscale, K_rzero, V_resid, V_rscale, V_rzero,
    # Pointers: partials, the output, and one ticket per (sequence, kv head) for the merge (0 between calls)
    Mid_o, Mid_lse, Out, Tickets,
    # Scalars
    qk_scale,  # softmax scale * log2(e)
    num_splits,  # programs per (sequence, kv head) over the closed blocks; grid axis 2 has one more
    # Strides
    stride_qb, stride_qh, stride_btb, stride_cs,
    stride_wn, stride_wt, stride_wh,  # window_k and window_v: slot, token, head (D contiguous)
    stride_rkn,  # ranks: block
    stride_bn, stride_br,  # basis: block, row
    stride_bsn,  # basis_scale, latent_scale, latent_zero: block
    stride_ln, stride_lt, stride_lr,  # latent: block, token, row (stream-major: tokens contiguous)
    stride_krn, stride_krt, stride_krh,  # k_resid: block, token, head
    stride_ksn, stride_kst, stride_ksh,  # k_rscale and k_rzero: block, token, head
    stride_vrn, stride_vrt, stride_vrh, stride_vrc,  # v_resid: block, token, head, byte
    stride_vsn, stride_vst, stride_vsh,
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    stride_ob, stride_oh,
    # Meta-parameters
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_GN: tl.constexpr, MERGE_CHUNK: tl.constexpr,
    HEAD_DIM: tl.constexpr,  # a power of two
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block (T)
    BLOCK_N: tl.constexpr,  # tokens per tile, divides BLOCK_SIZE
    WINDOW_N: tl.constexpr,  # tokens per tile of the window
    BLOCK_R: tl.constexpr,  # >= rank_max, >= 16, a power of two
    BLOCK_S: tl.constexpr,  # >= 2 * NUM_KV_HEADS, a power of two
    K_BITS: tl.constexpr, V_BITS: tl.constexpr,
    ROTATED_KEYS: tl.constexpr,  # key_frame=rotated: low-rank key scores are (q B^T) . latents, no RoPE per token
    HAS_CLOSED: tl.constexpr,  # each row's closed blocks given (its window may span consecutive slots)
    TILE_Q: tl.constexpr,  # query rows per program: 1 (axis 0 a row), or tiles of a sequence's consecutive rows
    MIN_TILES: tl.constexpr,  # the fewest tiles a split takes (MIN_TOKENS_PER_SPLIT / BLOCK_N)
    ASM: tl.constexpr,  # residual codes unpacked by inline PTX (compiled only; the interpreter takes the plain path)
):
    """Grid (B, num_kv_heads, num_splits + 1), or (tiles, ...) with TILE_Q > 1: the first splits
    share the closed (compressed) blocks' tiles, at least MIN_TILES each (`_blocks_partial`), and program num_splits
    takes the window (`_window_partial`). The split count comes from the block table's width; the sequence's own
    length can leave the last splits without tiles.
    Those store nothing, and the window's partial goes right after the busy splits', so the merge reads only
    partials with tokens behind them (`merge_if_last`: one chunk of 32 partials instead of two at B=1 L=4k,
    BENCHMARKS.md 2g)."""
    if TILE_Q == 1:
        pid_b = tl.program_id(0).to(tl.int64)
        num_rows = 1
    else:  # a tile: rows pid_b.. of one sequence, which share its closed blocks, table and window
        pid_b = tl.load(Tile_starts + tl.program_id(0)).to(tl.int64)
        num_rows = tl.load(Tile_counts + tl.program_id(0))
        if num_rows == 0:  # an unused tile
            return
    # a tile's queries are the columns (row, head), the rows laid out as heads of [rows x Hq] (q, the partials and
    # the output contiguous over (row, head)), so every offset below is the one-row code's
    TILES: tl.constexpr = BLOCK_SIZE // BLOCK_N
    pid_kvh = tl.program_id(1)
    pid_s = tl.program_id(2)

    offs_g = tl.arange(0, BLOCK_G)
    first_len = tl.load(Seq_lens + pid_b)
    if TILE_Q == 1:
        seq_len = first_len
        row_lens = seq_len
        mask_g = offs_g < GROUP
        heads = pid_kvh * GROUP + offs_g
    else:
        GP: tl.constexpr = BLOCK_G // TILE_Q
        seq_len = tl.load(Seq_lens + pid_b + num_rows - 1)  # the tile's last row sees the most
        mask_g = (offs_g % GP < GROUP) & (offs_g // GP < num_rows)
        heads = offs_g // GP * (NUM_KV_HEADS * GROUP) + pid_kvh * GROUP + offs_g % GP
        row_lens = tl.load(Seq_lens + pid_b + offs_g // GP, mask=mask_g, other=seq_len)
    if HAS_CLOSED:
        n_closed = tl.load(Closed + pid_b)
    else:
        n_closed = tl.maximum(first_len - 1, 0) // BLOCK_SIZE  # the window holds the last 1..BLOCK_SIZE tokens

    offs_h = tl.arange(0, HEAD_DIM // 2)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_R)

    n_tiles = n_closed * TILES
    tiles_per_split = tl.maximum(tl.cdiv(n_tiles, num_splits), MIN_TILES)
    busy = tl.cdiv(n_tiles, tiles_per_split)  # splits with tiles; the window's partial is the next one
    part = tl.where(pid_s == num_splits, busy, pid_s)
    o_row, lse_row = Mid_o + pid_b * stride_mob + part * stride_mos, Mid_lse + pid_b * stride_mlb + part

    if pid_s == num_splits:
        _window_partial(Q, Window_slots, Window_k, Window_v, Cos, Sin, o_row, lse_row,
                        pid_b, pid_kvh, heads, mask_g, n_closed, seq_len, row_lens, qk_scale, offs_h, offs_d,
                        stride_qb, stride_qh, stride_cs, stride_wn, stride_wt, stride_wh, stride_moh, stride_mlh,
                        BLOCK_G, HEAD_DIM, BLOCK_SIZE, WINDOW_N, TILE_Q)
    elif pid_s < busy:
        _blocks_partial(Q, Block_tables, Cos, Sin,
                        Ranks, Basis, Basis_scale, Latent, Latent_scale, Latent_zero,
                        K_resid, K_rscale, K_rzero, V_resid, V_rscale, V_rzero,
                        o_row, lse_row,
                        pid_b, pid_kvh, pid_s, tiles_per_split, n_tiles, num_rows, qk_scale, offs_h, offs_n, offs_r,
                        stride_qb, stride_qh, stride_btb, stride_cs, stride_rkn, stride_bn, stride_br, stride_bsn,
                        stride_ln, stride_lt, stride_lr, stride_krn, stride_krt, stride_krh, stride_ksn, stride_kst,
                        stride_ksh, stride_vrn, stride_vrt, stride_vrh, stride_vrc, stride_vsn, stride_vst, stride_vsh,
                        stride_moh, stride_mlh,
                        NUM_KV_HEADS, GROUP, BLOCK_GN, HEAD_DIM, BLOCK_SIZE, BLOCK_N, BLOCK_R, BLOCK_S,
                        K_BITS, V_BITS, ROTATED_KEYS, ASM, TILE_Q)

    merge_if_last(Tickets + pid_b * NUM_KV_HEADS + pid_kvh, num_splits + 1, busy + 1, Mid_o + pid_b * stride_mob,
                  Mid_lse + pid_b * stride_mlb, Out + pid_b * stride_ob, heads, mask_g,
                  offs_d, offs_d < HEAD_DIM, stride_moh, stride_mos, stride_mlh, stride_oh, BLOCK_G, HEAD_DIM,
                  MERGE_CHUNK)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def _tiles_config(cache: AlrkvdLayer, num_q_heads: int, device: torch.device) -> dict:
    return get_config("alrkvd_tiles_stage1", f"head_dim={cache.head_dim},group={num_q_heads // cache.num_kv_heads},"
                      f"block_size={cache.block_size},k_bits={cache.k_bits}", device, _TILES_STAGE1)


def tile_rows(cache: AlrkvdLayer, num_q_heads: int, device: torch.device) -> int:
    """The most query rows a tile of `alrkvd_decode_attention(..., tile_starts=...)` may hold."""
    return _tiles_config(cache, num_q_heads, device)["TILE_Q"]


def _stage1_config(q, cache: AlrkvdLayer, block_tables, tiles: bool = False) -> dict:
    """Stage 1's launch parameters (kernels/tuning.py), MIN_TOKENS_PER_SPLIT included; `tiles`: those of tiles
    of query rows (TILE_Q included)."""
    batch, num_q_heads, head_dim = q.shape
    group = num_q_heads // cache.num_kv_heads
    if tiles:
        return _tiles_config(cache, num_q_heads, q.device)
    cfg = get_config("alrkvd_decode_stage1",
                     f"head_dim={head_dim},group={group},block_size={cache.block_size},k_bits={cache.k_bits}",
                     q.device, _DEFAULT_STAGE1)
    many = (batch * cache.num_kv_heads >= MANY_PAIRS
            or block_tables.shape[1] * cache.block_size >= cfg.get("LONG_TOKENS", float("inf")))
    return launch_config(cfg, many, cache.rank_max, cache.rotated_keys)


def launch_config(cfg: dict, many_pairs: bool, rank_max: int, rotated_keys: bool) -> dict:
    """The launch a `_DEFAULT_STAGE1`-style config gives: its *_MANY_PAIRS entries applied where `many_pairs`
    (from MANY_PAIRS (sequence, kv head) pairs, or a table of LONG_TOKENS), and dropped."""
    cfg = dict(cfg)
    cfg.pop("LONG_TOKENS", None)
    many_pairs_warps = cfg.pop("NUM_WARPS_MANY_PAIRS", None)
    heavy_tile = cfg.pop("BLOCK_N_MANY_PAIRS_HEAVY", None)
    window_tile = cfg.pop("WINDOW_N_MANY_PAIRS", None)
    window_cost = cfg.pop("WINDOW_TILES_MANY_PAIRS", None)
    if many_pairs and many_pairs_warps:
        cfg["num_warps"] = many_pairs_warps
        cfg["WINDOW_N"] = window_tile or cfg["WINDOW_N"]
        cfg["WINDOW_TILES"] = window_cost or cfg["WINDOW_TILES"]
        if heavy_tile and (rank_max > 32 or not rotated_keys):
            cfg["BLOCK_N"] = heavy_tile
    return cfg


def _alrkvd_stage1(q, cache: AlrkvdLayer, window_k, window_v, block_tables, seq_lens, window_slots,
                   cos, sin, scale, closed, tiles, mid_o, mid_lse, out, tickets, cfg: dict, min_tokens: int,
                   warmup: bool = False):
    """Launches stage 1 (or, with `warmup`, only compiles it); returns the compiled kernel. `tiles`: None, or
    (tile_starts, tile_counts), and cfg's TILE_Q."""
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads, block_size = cache.num_kv_heads, cache.block_size
    num_partials = mid_o.shape[2]
    assert mid_o.shape == (batch, num_q_heads, num_partials, head_dim) and mid_o.dtype == torch.float32
    assert mid_lse.shape == (batch, num_q_heads, num_partials) and mid_lse.dtype == torch.float32
    group = num_q_heads // num_kv_heads
    block_n, window_n = min(cfg.pop("BLOCK_N"), block_size), min(cfg.pop("WINDOW_N"), block_size)
    assert block_size % block_n == 0
    tile_q = cfg.pop("TILE_Q", 1) if tiles is not None else 1
    block_g = tile_q * triton.next_power_of_2(group)  # the columns: (row, head) pairs
    grid = (batch if tiles is None else tiles[0].shape[0], num_kv_heads, num_partials)
    tile_starts, tile_counts = tiles if tiles is not None else (seq_lens, seq_lens)  # (unread without tiles)
    launch = functools.partial(_alrkvd_decode_stage1.warmup, grid=grid) if warmup else _alrkvd_decode_stage1[grid]
    return launch(
        q, block_tables, seq_lens, seq_lens if closed is None else closed, window_slots, window_k, window_v,
        tile_starts, tile_counts, cos, sin,
        cache.ranks, cache.basis, cache.basis_scale, cache.latent, cache.latent_scale, cache.latent_zero,
        cache.k_resid, cache.k_rscale, cache.k_rzero, cache.v_resid, cache.v_rscale, cache.v_rzero,
        mid_o, mid_lse, out, tickets,
        scale * LOG2E, num_partials - 1,
        q.stride(0), q.stride(1), block_tables.stride(0), cos.stride(0),
        window_k.stride(0), window_k.stride(1), window_k.stride(2),
        cache.ranks.stride(0),
        cache.basis.stride(0), cache.basis.stride(1),
        cache.basis_scale.stride(0),
        cache.latent.stride(0), cache.latent.stride(1), cache.latent.stride(2),
        cache.k_resid.stride(0), cache.k_resid.stride(1), cache.k_resid.stride(2),
        cache.k_rscale.stride(0), cache.k_rscale.stride(1), cache.k_rscale.stride(2),
        cache.v_resid.stride(0), cache.v_resid.stride(1), cache.v_resid.stride(2), cache.v_resid.stride(3),
        cache.v_rscale.stride(0), cache.v_rscale.stride(1), cache.v_rscale.stride(2),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        NUM_KV_HEADS=num_kv_heads, GROUP=group,
        # the window's dots keep the group on the 16-row side (tl.dot pads M itself), the closed tiles' on 8 columns
        # (a tile's merge at half the registers: at 64 columns and 8 warps, 4 partials a step spilled 552 bytes, 2
        # spilled 144; sm_90, `benchmarks/sass_count.py`)
        BLOCK_G=block_g, BLOCK_GN=max(8, block_g),
        MERGE_CHUNK=merge_chunk(block_g, head_dim, cfg["num_warps"], 128 if tiles is None else 64),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, WINDOW_N=window_n,
        BLOCK_R=max(16, triton.next_power_of_2(cache.rank_max)),
        BLOCK_S=triton.next_power_of_2(2 * num_kv_heads),
        K_BITS=cache.k_bits, V_BITS=cache.v_bits, ROTATED_KEYS=cache.rotated_keys, HAS_CLOSED=closed is not None,
        TILE_Q=tile_q, MIN_TILES=max(1, min_tokens // block_n), ASM=q.is_cuda, **cfg,
    )


def _check_layer(cache: AlrkvdLayer, window_k, window_v) -> None:
    H, D, T = cache.num_kv_heads, cache.head_dim, cache.block_size
    assert D & (D - 1) == 0 and D >= 32, "head_dim must be a power of two >= 32"
    assert cache.ranks.dtype == torch.int16 and cache.basis.dtype == torch.int8
    assert cache.latent.dtype == torch.uint8 and cache.latent.shape[2] == cache.basis.shape[1]
    for t in (cache.basis, cache.k_resid, cache.ranks, cache.basis_scale, cache.latent_scale, cache.latent_zero):
        assert t.stride(-1) == 1
    assert cache.k_rscale.shape[-1] == 1 and cache.k_rzero.stride() == cache.k_rscale.stride()
    assert cache.v_rscale.shape[-1] == 1 and cache.v_rzero.stride() == cache.v_rscale.stride()
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
    cos: torch.Tensor,
    sin: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    tickets: torch.Tensor | None = None,
    closed: torch.Tensor | None = None,
    tile_starts: torch.Tensor | None = None,
    tile_counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention of `q [B, Hq, D]` (rotated) over an ALR-KVD layer; returns `[B, Hq, D]`.

    cache: `AlrkvdLayer.from_format(fmt, layer)`. window_k/window_v: this layer's window
    `[num_slots, block_size, Hkv, D]` (keys not rotated). block_tables `[B, max_blocks]` int32: the
    first (seq_len - 1) // block_size entries are the closed blocks; the window holds the other
    1..block_size tokens. seq_lens `[B]` int32: cached tokens,
    the new one included. window_slots `[B]` int32: each sequence's window slot. cos/sin: RoPE tables
    `[max_pos, D]` fp32 (backend.model.Rotary.cos/.sin), max_pos >= every seq_len. num_splits: programs per (sequence, kv head) over the
    closed blocks (one more takes the window); default from the shapes. tickets: int32 zeros of at least
    B x Hkv entries, 0 again after the call (`decode_tickets`); None allocates them. closed `[B]` int32, at most
    (seq_len - 1) // block_size: each row's closed blocks instead, its window the other tokens from its slot on,
    through the slots after it (a prompt chunk across blocks: the blocks it filled are not compressed yet).
    tile_starts, tile_counts `[num_tiles]` int32: the rows in tiles of consecutive rows of one sequence each, at
    most `tile_rows(...)` rows a tile (counts 0: unused tiles), which share their
    first row's closed blocks, table and window slot and each attend causally by their own seq_len (a prompt
    chunk's rows); one program reads each compressed tile for all the rows of a tile. No host sync.
    """
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads, block_size = cache.num_kv_heads, cache.block_size
    check_decode_inputs(q, block_tables, seq_lens, num_kv_heads, head_dim)
    _check_layer(cache, window_k, window_v)
    assert cache.head_dim == head_dim
    assert window_slots.dtype == torch.int32 and window_slots.shape == (batch,)
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == sin.shape and cos.shape[1] == head_dim
    assert cos.stride() == sin.stride() and cos.stride(1) == 1 and cos.shape[0] >= block_size
    if closed is not None:  # windows across slots: one slot's tokens run on into the next's
        assert closed.dtype == torch.int32 and closed.shape == (batch,)
        assert window_k.is_contiguous() and window_v.is_contiguous()
    tiles = None
    if tile_starts is not None:  # rows as heads of [rows x Hq]: q, the partials and the output contiguous
        assert tile_starts.dtype == tile_counts.dtype == torch.int32 and tile_starts.shape == tile_counts.shape
        assert q.stride(0) == num_q_heads * q.stride(1)
        tiles = (tile_starts, tile_counts)
    cfg = _stage1_config(q, cache, block_tables, tiles is not None)
    min_tokens = cfg.pop("MIN_TOKENS_PER_SPLIT", MIN_TOKENS_PER_SPLIT)
    window_tiles = cfg.pop("WINDOW_TILES", 0.0)
    tickets = decode_tickets(tickets, batch * num_kv_heads, q.device)
    inputs = (q, cache, window_k, window_v, block_tables, seq_lens, window_slots, cos, sin, scale, closed, tiles)

    def partials(n):
        return (torch.empty(batch, num_q_heads, n, head_dim, dtype=torch.float32, device=q.device),
                torch.empty(batch, num_q_heads, n, dtype=torch.float32, device=q.device),
                torch.empty(batch, num_q_heads, head_dim, dtype=q.dtype, device=q.device))

    if num_splits is None and tiles is not None:  # a long row's blocks over programs (the tiles' count says little)
        num_splits = tile_num_splits(batch, num_q_heads, head_dim, block_tables.shape[1] * block_size, min_tokens)
    if num_splits is None:  # whole waves of the programs the GPU runs at once
        key = ("alrkvd", q.device, q.dtype, q.shape[1:], cache.block_size, num_kv_heads, cache.k_bits, cache.v_bits,
               cache.rank_max, cache.rotated_keys, closed is not None, tuple(sorted(cfg.items())))
        num_splits = windowed_num_splits(
            lambda: _alrkvd_stage1(*inputs, *partials(3), tickets, dict(cfg), min_tokens, warmup=True), key,
            batch if tiles is None else tile_starts.shape[0], num_kv_heads, block_tables.shape[1], block_size,
            min(cfg["BLOCK_N"], block_size), min_tokens, q.device, window_tiles)
    mid_o, mid_lse, out = partials(num_splits + 1)
    _alrkvd_stage1(*inputs, mid_o, mid_lse, out, tickets, cfg, min_tokens)
    return out


# ----------------------------------------------------------------------------------------------
# Closed blocks rebuilt as dense keys and values (a prompt chunk's history, for flash attention)
# ----------------------------------------------------------------------------------------------
@triton.jit
def _stream_low_rank(Basis_blk, Latent_blk, off, mask_r, basis_scale, latent_scale, latent_zero, cols, offs_t, offs_r,
                     stride_br, stride_lt, stride_lr, DOT_PRECISION: tl.constexpr):
    """A block's low-rank part of one stream (its basis rows from `off`, `mask_r` of its rank, the scales of
    `_stream_scales`), latents @ basis [T, len(cols)], of the basis columns `cols`."""
    rows = off + offs_r
    basis = tl.load(Basis_blk + rows[:, None] * stride_br + cols[None, :], mask=mask_r[:, None], other=0)
    basis = basis.to(tl.float32) * basis_scale.to(tl.float32)[:, None]
    lat = tl.load(Latent_blk + offs_t[:, None] * stride_lt + rows[None, :] * stride_lr, mask=mask_r[None, :], other=0)
    # rows past the stream's rank: scale and zero 0, so 0
    lat = lat.to(tl.float32) * latent_scale.to(tl.float32)[None, :] + latent_zero.to(tl.float32)[None, :]
    return tl.dot(lat, basis, input_precision=DOT_PRECISION)


@triton.jit
def _dense_residual(Resid, Rscale, Rzero, block, h, offs_t, offs_d, stride_rn, stride_rt, stride_rh, stride_rc,
                    stride_sn, stride_st, stride_sh, HEAD_DIM: tl.constexpr, BITS: tl.constexpr):
    """Block `block`'s residual [T, D] of head h: column j's code sits in byte j % (D * BITS / 8), at bit
    (j // (D * BITS / 8)) * BITS (backend.kv_formats.pack_bits' runs); codes * scale + zero per token."""
    NB: tl.constexpr = HEAD_DIM * BITS // 8
    byte = tl.load(Resid + block * stride_rn + h * stride_rh + offs_t[:, None] * stride_rt
                   + (offs_d % NB)[None, :] * stride_rc).to(tl.int32)
    code = (byte >> ((offs_d // NB) * BITS)[None, :]) & ((1 << BITS) - 1)
    scales = block * stride_sn + h * stride_sh + offs_t * stride_st
    scale = tl.load(Rscale + scales).to(tl.float32)
    zero = tl.load(Rzero + scales).to(tl.float32)
    return code.to(tl.float32) * scale[:, None] + zero[:, None]


@triton.jit
def _alrkvd_rebuild_kernel(
    Blocks, Cos, Sin, Ranks, Basis, Basis_scale, Latent, Latent_scale, Latent_zero,
    K_resid, K_rscale, K_rzero, V_resid, V_rscale, V_rzero, K_out, V_out,
    stride_cos, stride_rn, stride_bn, stride_br, stride_bsn, stride_ln, stride_lt, stride_lr,
    stride_krn, stride_krt, stride_krh, stride_ksn, stride_kst, stride_ksh,
    stride_vrn, stride_vrt, stride_vrh, stride_vrc, stride_vsn, stride_vst, stride_vsh,
    stride_on, stride_oh,
    NUM_KV_HEADS: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr, ROTATED_KEYS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Grid (blocks, kv heads): block i of `Blocks` (a sequence's i-th, tokens at positions i * T + t) rebuilt for
    one head as the decode kernel reads it: keys rotated, values, into rows i * T .. of K_out, V_out."""
    i = tl.program_id(0)
    h = tl.program_id(1)
    block = tl.load(Blocks + i).to(tl.int64)
    offs_t = tl.arange(0, BLOCK_SIZE)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_r = tl.arange(0, BLOCK_R)
    offs_s = tl.arange(0, BLOCK_S)
    out = (i * BLOCK_SIZE + offs_t)[:, None] * stride_on + h * stride_oh + offs_d[None, :]
    rk = tl.load(Ranks + block * stride_rn + offs_s, mask=offs_s < 2 * NUM_KV_HEADS, other=0)
    off_k, mk, off_v, mv = _stream_rows(rk, offs_s, offs_r, h, NUM_KV_HEADS)
    bk_s, lk_s, lk_z, bv_s, lv_s, lv_z = _stream_scales(block, rk, offs_s, offs_r, h, Basis_scale, Latent_scale,
                                                        Latent_zero, stride_bsn, NUM_KV_HEADS)
    basis_blk, lat_blk = Basis + block * stride_bn, Latent + block * stride_ln

    k = _stream_low_rank(basis_blk, lat_blk, off_k, mk, bk_s, lk_s, lk_z, offs_d, offs_t, offs_r, stride_br,
                         stride_lt, stride_lr, DOT_PRECISION)
    if not ROTATED_KEYS:  # post_rope: the low-rank part is before RoPE; rotate it by each token's position
        half: tl.constexpr = HEAD_DIM // 2
        swapped = _stream_low_rank(basis_blk, lat_blk, off_k, mk, bk_s, lk_s, lk_z, (offs_d + half) % HEAD_DIM,
                                   offs_t, offs_r, stride_br, stride_lt, stride_lr, DOT_PRECISION)
        pos = (i * BLOCK_SIZE + offs_t)[:, None] * stride_cos + offs_d[None, :]
        sign = tl.where(offs_d < half, -1.0, 1.0)[None, :]  # rotate_half(x) = (-x2, x1)
        k = k * tl.load(Cos + pos) + swapped * sign * tl.load(Sin + pos)
    k += _dense_residual(K_resid, K_rscale, K_rzero, block, h, offs_t, offs_d, stride_krn, stride_krt, stride_krh,
                         1, stride_ksn, stride_kst, stride_ksh, HEAD_DIM, K_BITS)
    tl.store(K_out + out, k.to(K_out.dtype.element_ty))
    v = _stream_low_rank(basis_blk, lat_blk, off_v, mv, bv_s, lv_s, lv_z, offs_d, offs_t, offs_r, stride_br,
                         stride_lt, stride_lr, DOT_PRECISION)
    v += _dense_residual(V_resid, V_rscale, V_rzero, block, h, offs_t, offs_d, stride_vrn, stride_vrt, stride_vrh,
                         stride_vrc, stride_vsn, stride_vst, stride_vsh, HEAD_DIM, V_BITS)
    tl.store(V_out + out, v.to(V_out.dtype.element_ty))


def alrkvd_rebuild_blocks(cache: AlrkvdLayer, blocks: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys (rotated) and values `[len(blocks) * T, Hkv, D]` in `dtype` of closed blocks taken as a sequence's first
    blocks (token i at position i): `alrkvd_decode_blocks_ref`'s result in one launch, with the decode kernel's
    storage contract (`AlrkvdLayer`). For a prompt chunk's history: its attention then runs as flash attention over
    these, where the decode kernel would read the compressed blocks once per query row. No host sync."""
    H, D, T = cache.num_kv_heads, cache.head_dim, cache.block_size
    assert blocks.dtype == torch.int32 and blocks.dim() == 1
    assert D & (D - 1) == 0 and T & (T - 1) == 0 and T >= 16, "head_dim and block_size: powers of two, T >= 16"
    assert cache.basis_scale.stride() == cache.latent_scale.stride() == cache.latent_zero.stride()  # one stride_bsn
    assert cache.k_resid.stride(-1) == 1
    assert cache.k_rzero.stride() == cache.k_rscale.stride() and cache.v_rzero.stride() == cache.v_rscale.stride()
    n = blocks.numel()
    k_out = torch.empty(n * T, H, D, dtype=dtype, device=blocks.device)
    v_out = torch.empty_like(k_out)
    if n == 0:
        return k_out, v_out
    assert cache.rotated_keys or cos.shape[0] >= n * T
    _alrkvd_rebuild_kernel[(n, H)](
        blocks, cos, sin, cache.ranks, cache.basis, cache.basis_scale, cache.latent, cache.latent_scale,
        cache.latent_zero, cache.k_resid, cache.k_rscale, cache.k_rzero, cache.v_resid, cache.v_rscale, cache.v_rzero,
        k_out, v_out,
        cos.stride(0), cache.ranks.stride(0), cache.basis.stride(0), cache.basis.stride(1), cache.basis_scale.stride(0),
        cache.latent.stride(0), cache.latent.stride(1), cache.latent.stride(2),
        cache.k_resid.stride(0), cache.k_resid.stride(1), cache.k_resid.stride(2),
        cache.k_rscale.stride(0), cache.k_rscale.stride(1), cache.k_rscale.stride(2),
        cache.v_resid.stride(0), cache.v_resid.stride(1), cache.v_resid.stride(2), cache.v_resid.stride(3),
        cache.v_rscale.stride(0), cache.v_rscale.stride(1), cache.v_rscale.stride(2),
        k_out.stride(0), k_out.stride(1),
        NUM_KV_HEADS=H, BLOCK_SIZE=T, HEAD_DIM=D, BLOCK_R=max(16, triton.next_power_of_2(cache.rank_max)),
        BLOCK_S=triton.next_power_of_2(2 * H), K_BITS=cache.k_bits, V_BITS=cache.v_bits,
        ROTATED_KEYS=cache.rotated_keys, DOT_PRECISION="tf32" if blocks.is_cuda else "ieee",  # tf32: the decode
        # kernel's own operands are fp16
        num_warps=4 if cache.rotated_keys else 8,  # sm_90 build (kernels.aot_check): 128 / 182 registers, no spill;
        # post_rope's second low-rank product at 4 warps spills 160 bytes
    )
    return k_out, v_out


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
        chunk = p[..., pos:pos + n // per]  # value j in byte j % (n // per) at bit (j // (n // per)) * w
        vals = (chunk[..., None, :] >> (torch.arange(per, device=p.device)[:, None] * w)) & ((1 << w) - 1)
        out |= vals.reshape(*p.shape[:-1], n) << shift
        pos += n // per
        shift += w
    return out


def alrkvd_decode_blocks_ref(cache: AlrkvdLayer, blocks: torch.Tensor, cos: torch.Tensor,
                             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 keys (rotated) and values `[len(blocks) * T, H, D]` of closed blocks, taken as the first
    blocks of a sequence (token i at position i)."""
    H, D, T = cache.num_kv_heads, cache.head_dim, cache.block_size
    blocks = blocks.long()
    n = blocks.numel()
    basis = cache.basis[blocks].float() * cache.basis_scale[blocks].float()[..., None]  # [n, R, D]
    lat = cache.latent[blocks].float() * cache.latent_scale[blocks].float()[:, None] \
        + cache.latent_zero[blocks].float()[:, None]  # [n, T, R]
    ranks = cache.ranks[blocks].long()  # [n, 2H]
    low = torch.zeros(n, T, 2 * H, D, device=basis.device)
    for i in range(n):
        ends = ranks[i].cumsum(0).tolist()
        for s, (a, b) in enumerate(zip([0] + ends[:-1], ends)):
            low[i, :, s] = lat[i, :, a:b] @ basis[i, a:b]
    low = low.flatten(0, 1)  # [n T, 2H, D]
    resid = [_unpack_ref(getattr(cache, f"{kv}_resid")[blocks], getattr(cache, f"{kv}_bits"), D).float()
             * getattr(cache, f"{kv}_rscale")[blocks].float() + getattr(cache, f"{kv}_rzero")[blocks].float()
             for kv in ("k", "v")]  # [n, T, H, D]
    k = (low[:, :H] if cache.rotated_keys else rope_ref(low[:, :H], cos[: n * T], sin[: n * T])) + resid[0].flatten(0, 1)
    return k, low[:, H:] + resid[1].flatten(0, 1)


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF half-split RoPE of `x [L, H, D]` in fp32 with the table rows `cos`, `sin` `[L, D]` of its positions."""
    half = x.shape[-1] // 2
    return x.float() * cos[:, None] + torch.cat([-x[..., half:], x[..., :half]], -1).float() * sin[:, None]


def alrkvd_decode_attention_ref(
    q: torch.Tensor,
    cache: AlrkvdLayer,
    window_k: torch.Tensor,
    window_v: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    window_slots: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    kv_dtype: torch.dtype | None = None,
    closed: torch.Tensor | None = None,
    tile_starts: torch.Tensor | None = None,
    tile_counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """The contract of `alrkvd_decode_attention` in fp32 PyTorch (decode blocks and window, attend), row by row.
    `num_splits` and the tiles are ignored; `kv_dtype` rounds the rebuilt, rotated keys and the values to that dtype
    before attending (what the kernel's fp16 tl.dot operands do), for error budgets in tests."""
    out = torch.empty_like(q)
    T = cache.block_size
    for b, seq_len in enumerate(seq_lens.tolist()):
        n_closed = max(seq_len - 1, 0) // T if closed is None else int(closed[b])
        k, v = alrkvd_decode_blocks_ref(cache, block_tables[b, :n_closed], cos, sin)
        first = int(window_slots[b]) * T  # the window's tokens, from its slot on
        wk, wv = (w.flatten(0, 1)[first:first + seq_len - n_closed * T] for w in (window_k, window_v))
        k = torch.cat([k, rope_ref(wk, cos[n_closed * T:seq_len], sin[n_closed * T:seq_len])])
        v = torch.cat([v, wv.float()])
        if kv_dtype is not None:
            k, v = k.to(kv_dtype), v.to(kv_dtype)
        out[b] = attend_ref(q[b], k, v, scale).to(q.dtype)
    return out
