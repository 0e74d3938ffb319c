"""Decode attention over the full-precision paged KV cache (flash-decoding, Triton).

One query token per sequence attends to its whole cached context. The context is split across
programs (stage 1: each program owns one kv head of one sequence and a contiguous run of tokens,
and computes the partial softmax-weighted sum for every query head of that GQA group at once);
stage 2 merges the partials with their log-sum-exp. Stage 2 is shared by the KIVI kernel; the ALR-KVD
kernel writes the same partials and merges them inside its stage 1 instead (`merge_if_last`).

Layout (docs/CONTRACTS.md), per layer:
    k_cache, v_cache  [num_blocks, block_size, num_kv_heads, head_dim]   keys already rotated
    q                 [B, num_q_heads, head_dim]
    block_tables      [B, max_blocks] int32      block ids of each sequence, in order
    seq_lens          [B] int32                  cached tokens of each sequence (the new one included)
    returns           [B, num_q_heads, head_dim] in q's dtype
Query head i reads kv head i // (num_q_heads // num_kv_heads), as in HF `repeat_kv`.

Public: `paged_decode_attention` (the dispatcher) and `paged_decode_attention_ref` (PyTorch);
`paged_tiles_attention` takes a whole step's query rows (prompt chunks and decodes) in tiles of one
sequence's consecutive tokens (`query_tiles`), so a mixed step runs in one CUDA graph; `store_kv` writes a
step's new keys and values into the cache (or a windowed format's window) in one launch.
Nothing runs at import. Structure after vLLM's `triton_decode_attention.py` (stage1/stage2),
written anew for this layout: all heads of a group share each K/V tile (tl.dot), splits are whole
tiles, offsets are int64, exp2 with the scale folded into q.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from kernels.tuning import get_config, num_sms, resident_programs

LOG2E = 1.4426950408889634

# Stage 1 launch parameters when no tuned JSON exists (kernels/tuning.py); tuned per device there.
_DEFAULT_STAGE1 = {"BLOCK_N": 64, "num_warps": 8, "num_stages": 2}  # sm_90: 59 regs, no spill
# Fewest tokens one split should cover: below this the merge costs more than the parallelism gains (the default;
# a tuned config may set its own MIN_TOKENS_PER_SPLIT).
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 64


# ----------------------------------------------------------------------------------------------
# Stage 1: partial attention of one (sequence, kv head, split)
# ----------------------------------------------------------------------------------------------
@triton.jit
def softmax_update(s, mask_n, m_i, l_i, AXIS: tl.constexpr = 1, ADD_SUM: tl.constexpr = True):
    """Online softmax step over a tile of scores s [BLOCK_G, BLOCK_N] (log2 units; columns outside
    mask_n ignored), or with AXIS 0 over transposed scores [BLOCK_N, G]: returns the tile's weights p, the
    rescale alpha of the running sums, m and l (without ADD_SUM, l rescaled only: the caller adds the sum of p,
    which it takes its own way; l may then be a [R, G] block, every row rescaled)."""
    s = tl.where(tl.expand_dims(mask_n, 1 - AXIS), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, AXIS))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - tl.expand_dims(m_new, AXIS))
    if ADD_SUM:
        return p, alpha, m_new, l_i * alpha + tl.sum(p, AXIS)
    return p, alpha, m_new, l_i * alpha


@triton.jit
def fp16_bits(x):
    """A low-bit code x (int16, at most 10 bits) as fp16 without an int-to-float conversion: (x | 0x6400) read
    as fp16 is 1024 + x, exact (the compressed formats' decode kernels; the ALR-KVD kernel takes the 1024 off its
    dots' results)."""
    return (x | 0x6400).to(tl.float16, bitcast=True)


@triton.jit
def fp16_code(x):
    """`fp16_bits` with the 1024 taken off (exact): the code x itself, as fp16."""
    return fp16_bits(x) - 1024.0


@triton.jit
def store_partial(Mid_o_row, Mid_lse_row, acc, m_i, l_i, heads, offs_d, mask_g, mask_d, stride_moh, stride_mlh):
    """Store a split's normalised partial output and its log2-sum-exp2 (an empty split: 0 and -inf)."""
    nonempty = l_i > 0
    l_safe = tl.where(nonempty, l_i, 1.0)
    lse = tl.where(nonempty, m_i + tl.log2(l_safe), float("-inf"))
    tl.store(Mid_o_row + heads[:, None] * stride_moh + offs_d[None, :], acc / l_safe[:, None],
             mask=mask_g[:, None] & mask_d[None, :])
    tl.store(Mid_lse_row + heads * stride_mlh, lse, mask=mask_g)


@triton.jit
def merge_if_last(Ticket, num_programs, num_partials, Mid_o_row, Mid_lse_row, Out_row, heads, mask_g, offs_d,
                  mask_d, stride_moh, stride_mos, stride_mlh, stride_oh, BLOCK_G: tl.constexpr,
                  BLOCK_D: tl.constexpr, CHUNK: tl.constexpr):
    """Stage 2 inside stage 1: the last of a (sequence, kv head)'s `num_programs` programs to finish merges the
    first `num_partials` partials into `Out`, out[h] = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max),
    and sets the ticket back to 0 for the next call. Saves the second kernel: 19.5 -> 18.6 us for ALR-KVD at
    B=1 L=4k on the H200 (BENCHMARKS.md 2e). One pass over the partials with a running max (as stage 1's
    softmax): each step's lse and partial outputs load together, one round trip to L2 a step instead of two.
    The barrier and the acquire-release ticket order every thread's partial before the merge's reads, which
    skip L1 (.cg): other SMs wrote them. Mid_o_row, Mid_lse_row, Out_row: this sequence's rows. CHUNK:
    partials per step (`merge_chunk`)."""
    tl.debug_barrier()
    ticket = tl.atomic_add(Ticket, 1, sem="acq_rel", scope="gpu")
    if ticket == num_programs - 1:
        offs_c = tl.arange(0, CHUNK)
        lse_rows = Mid_lse_row + heads[:, None] * stride_mlh
        o_rows = Mid_o_row + heads[:, None, None] * stride_moh + offs_d[None, None, :]
        m = tl.full([BLOCK_G], -1e30, dtype=tl.float32)  # finite: a head with nothing cached gets weights 0
        acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
        denom = tl.zeros([BLOCK_G], dtype=tl.float32)
        for p0 in range(0, num_partials, CHUNK):
            mask_p = mask_g[:, None] & (p0 + offs_c < num_partials)[None, :]
            lse = tl.load(lse_rows + p0 + offs_c[None, :], mask=mask_p, other=float("-inf"), cache_modifier=".cg")
            o = tl.load(o_rows + (p0 + offs_c)[None, :, None] * stride_mos,
                        mask=mask_p[:, :, None] & mask_d[None, None, :], other=0.0, cache_modifier=".cg")
            m_new = tl.maximum(m, tl.max(lse, 1))
            alpha = tl.exp2(m - m_new)
            w = tl.exp2(lse - m_new[:, None])  # [BLOCK_G, CHUNK]
            acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * o, 1)
            denom = denom * alpha + tl.sum(w, 1)
            m = m_new
        # denom >= 1 when anything is cached (the largest weight is 1); 1 keeps an empty head at 0, not NaN
        tl.store(Out_row + heads[:, None] * stride_oh + offs_d[None, :], acc / tl.maximum(denom, 1.0)[:, None],
                 mask=mask_g[:, None] & mask_d[None, :])
        tl.atomic_xchg(Ticket, 0)


@triton.jit
def load_kv_tile(bt_row, k_head, v_head, start_n, end, offs_n, offs_d, mask_d,
                 stride_kn, stride_kt, stride_vn, stride_vt, PAGE_SIZE: tl.constexpr):
    """The keys and values [BLOCK_N, BLOCK_D] of tokens start_n + offs_n (those below `end`) of one kv head, gathered
    through the sequence's block table row: (token positions, their mask, k, v)."""
    tok = start_n + offs_n
    mask_n = tok < end
    block = tl.load(bt_row + tok // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
    slot = tok % PAGE_SIZE
    kv_mask = mask_n[:, None] & mask_d[None, :]
    k = tl.load(k_head + (block * stride_kn + slot * stride_kt)[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_head + (block * stride_vn + slot * stride_vt)[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    return tok, mask_n, k, v


# (ints that vary with the batch are not specialized: outside a graph, each new combination of ==1 and
# multiple-of-16 would compile the kernel again, as it did the ALR-KVD kernel's, journal 2026-12-05 20c)
@triton.jit(do_not_specialize=["num_splits", "stride_btb", "stride_mlb", "stride_mlh"])
def _paged_decode_stage1(
    # Pointers to tensors
    Q, K_cache, V_cache, Block_tables, Seq_lens, Mid_o, Mid_lse, Out, Tickets,
    # Scalars
    qk_scale,  # softmax scale * log2(e)
    num_splits,  # programs per (sequence, kv head): grid axis 2
    # Strides
    stride_qb, stride_qh,
    stride_kn, stride_kt, stride_kh,  # k_cache: block, token in block, kv head (head_dim contiguous)
    stride_vn, stride_vt, stride_vh,
    stride_btb,
    stride_mob, stride_moh, stride_mos,  # mid_o [B, Hq, S, D] (D contiguous)
    stride_mlb, stride_mlh,  # mid_lse [B, Hq, S] (S contiguous)
    stride_ob, stride_oh,  # out [B, Hq, D]
    # Meta-parameters
    GROUP: tl.constexpr,  # query heads per kv head
    BLOCK_G: tl.constexpr,  # GROUP padded to a tl.dot-able power of two (>= 16)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,  # tokens per tile
    DOT_DTYPE: tl.constexpr,  # the cache dtype (see `dot_dtype`)
    DOT_PRECISION: tl.constexpr,  # "ieee" for an fp32 cache (exact, as `full` promises; tf32 is not), else unused
    MERGE_G: tl.constexpr,  # GROUP padded to a power of two: the merge's heads (it needs no tl.dot's 16)
    MERGE_CHUNK: tl.constexpr,  # partials per step of the merge (`merge_chunk`)
    MIN_TILES: tl.constexpr,  # the fewest tiles a split takes (MIN_TOKENS_PER_SPLIT / BLOCK_N)
):
    """Grid (B, num_kv_heads, num_splits). Writes mid_o[b, heads, s] = softmax-normalised partial
    output and mid_lse[b, heads, s] = its log2-sum-exp2 (-inf for an empty split); the last program of a
    (sequence, kv head) merges them into out (`merge_if_last`). A sequence whose context is short for the
    launch (a CUDA graph's is sized for the longest its block table holds) uses only the splits of at least
    MIN_TILES tiles it fills, and the merge reads only theirs: at 4k in a graph, 16 partials instead of 64."""
    pid_b = tl.program_id(0).to(tl.int64)
    pid_kvh = tl.program_id(1)
    pid_s = tl.program_id(2)

    # -- this split's tokens: whole tiles, the last split takes what is left
    seq_len = tl.load(Seq_lens + pid_b)
    n_tiles = tl.cdiv(seq_len, BLOCK_N)
    tiles_per_split = tl.maximum(tl.cdiv(n_tiles, num_splits), MIN_TILES)
    busy = tl.cdiv(n_tiles, tiles_per_split)  # splits with tiles
    start = pid_s * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_g = offs_g < GROUP
    mask_d = offs_d < HEAD_DIM
    heads = pid_kvh * GROUP + offs_g

    # -- the group's queries, rounded to the cache dtype as tl.dot's operand
    q_ptrs = Q + pid_b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_g[:, None] & mask_d[None, :], other=0.0)
    q = q.to(K_cache.dtype.element_ty).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)

    bt_row = Block_tables + pid_b * stride_btb
    k_head = K_cache + pid_kvh.to(tl.int64) * stride_kh
    v_head = V_cache + pid_kvh.to(tl.int64) * stride_vh
    for start_n in range(start, end, BLOCK_N):
        _, mask_n, k, v = load_kv_tile(bt_row, k_head, v_head, start_n, end, offs_n, offs_d, mask_d,
                                       stride_kn, stride_kt, stride_vn, stride_vt, PAGE_SIZE)

        # -- online softmax over the tile, all query heads of the group at once
        s = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION) * qk_scale  # fp32, log2 units
        p, alpha, m_i, l_i = softmax_update(s, mask_n, m_i, l_i)
        pv = tl.dot(p.to(v.dtype).to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv

    mid_o_row, mid_lse_row = Mid_o + pid_b * stride_mob, Mid_lse + pid_b * stride_mlb
    if pid_s < busy:
        store_partial(mid_o_row + pid_s * stride_mos, mid_lse_row + pid_s,
                      acc, m_i, l_i, heads, offs_d, mask_g, mask_d, stride_moh, stride_mlh)
    offs_mg = tl.arange(0, MERGE_G)
    merge_if_last(Tickets + pid_b * tl.num_programs(1) + pid_kvh, num_splits, busy, mid_o_row, mid_lse_row,
                  Out + pid_b * stride_ob, pid_kvh * GROUP + offs_mg, offs_mg < GROUP, offs_d, mask_d, stride_moh,
                  stride_mos, stride_mlh, stride_oh, MERGE_G, BLOCK_D, MERGE_CHUNK)


# ----------------------------------------------------------------------------------------------
# Stage 2: merge the splits (shared by every cache format)
# ----------------------------------------------------------------------------------------------
@triton.jit
def _decode_reduce_stage2(
    # Pointers to tensors
    Mid_o, Mid_lse, Out,
    # Sizes
    num_partials,
    # Strides
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    stride_ob, stride_oh,
    # Meta-parameters
    BLOCK_P: tl.constexpr,  # num_partials padded to a power of two
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Grid (B, num_q_heads). out[b, h] = sum_s w_s mid_o[b, h, s] / sum_s w_s, w_s = 2^(lse_s - max); the
    values of partials whose lse is -inf are not read."""
    pid_b = tl.program_id(0).to(tl.int64)
    pid_h = tl.program_id(1).to(tl.int64)
    offs_p = tl.arange(0, BLOCK_P)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    lse_row = Mid_lse + pid_b * stride_mlb + pid_h * stride_mlh
    lse = tl.load(lse_row + offs_p, mask=offs_p < num_partials, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # nothing cached at all: output zeros, not NaN

    o_row = Mid_o + pid_b * stride_mob + pid_h * stride_moh
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    denom = 0.0
    for p in range(num_partials):
        lse_p = tl.load(lse_row + p)
        if lse_p > float("-inf"):  # a partial without keys may leave its values unwritten: not read
            w = tl.exp2(lse_p - m)
            acc += w * tl.load(o_row + p * stride_mos + offs_d, mask=mask_d, other=0.0)
            denom += w
    denom = tl.where(denom > 0, denom, 1.0)
    tl.store(Out + pid_b * stride_ob + pid_h * stride_oh + offs_d, acc / denom, mask=mask_d)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def default_num_splits(batch: int, num_kv_heads: int, max_len: int, device: torch.device,
                       min_tokens: int = MIN_TOKENS_PER_SPLIT) -> int:
    """Splits per sequence: enough programs for about four waves, each split >= min_tokens.
    Depends on shapes only (max_len = block-table width x block size), so no host sync."""
    want = triton.cdiv(4 * num_sms(device), batch * num_kv_heads)
    most = max(1, min(MAX_SPLITS, max_len // min_tokens))
    return max(1, min(want, most))


@functools.lru_cache(maxsize=None)  # called per layer and step in eager decode: a Python search over up to 64 counts
def wave_num_splits(pairs: int, tiles: int, resident: int, most: int, window_tiles: float = 0.0) -> int:
    """Splits per (sequence, kv head) for `pairs` of them over `tiles` tiles each, when the GPU runs `resident`
    programs at once: the fewest of 1..most that minimize waves x (tiles per split + 2), the 2 for a program's
    start and end (its first loads, not overlapped; the partial it stores). Programs past a whole wave run in
    another, so a split count that one wave does not hold costs a second pass. On the H200 (ALR-KVD, B=8
    L=32k) 9 splits took 502 us, 6 or 12 splits 407-412 us, and the model ranks the ten split counts
    measured there in nearly their measured order (BENCHMARKS.md section 2i). window_tiles: the time of the
    window's program (one more per pair, launched after the splits), in tiles; where the last wave's idle slots
    cannot take every window, the windows run after it and add that time (BENCHMARKS.md section 2r)."""
    def cost(s):
        waves = triton.cdiv(pairs * s, resident)
        late = window_tiles if waves * resident - pairs * s < pairs else 0.0
        return waves * (triton.cdiv(tiles, s) + 2) + late, s
    return min(range(1, max(1, most) + 1), key=cost)


_RESIDENT: dict[tuple, int] = {}  # a windowed decode kernel's launch (its key) -> programs the GPU runs at once


def windowed_num_splits(compile_stage1, key: tuple, batch: int, num_kv_heads: int, width: int, block_size: int,
                        block_n: int, min_tokens: int, device: torch.device, window_tiles: float = 0.0) -> int:
    """Splits per (sequence, kv head) of a windowed decode kernel (ALR-KVD, KIVI) over block tables `width`
    wide, the last block in the window. On CUDA: whole waves of the programs the GPU runs at once
    (`wave_num_splits`); `compile_stage1()` returns stage 1 compiled for 2 splits, specialized as most launches
    are, and is called once per `key`. Under the interpreter: `default_num_splits`. Shapes only: no host sync."""
    if device.type != "cuda":
        return default_num_splits(batch, num_kv_heads, width * block_size, device, min_tokens)
    if key not in _RESIDENT:
        _RESIDENT[key] = resident_programs(compile_stage1(), device)
    closed = max(1, width - 1)
    most = min(MAX_SPLITS, closed * block_size // min_tokens)
    return wave_num_splits(batch * num_kv_heads, closed * (block_size // block_n), _RESIDENT[key], most, window_tiles)


_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def dot_dtype(dtype: torch.dtype, device: torch.device):
    """The tl.dot operand type for a cache of `dtype`: the dtype itself, except bf16 under the CPU
    interpreter, whose tl.dot reads bf16 operands as raw uint16 (triton 3.9): there operands are
    rounded to bf16 first, then widened to fp32, which gives the same products."""
    if device.type == "cpu" and dtype == torch.bfloat16:
        return tl.float32
    return _TL_DTYPES[dtype]


def _group_block(group: int) -> int:
    return max(16, triton.next_power_of_2(group))


def stage1_config(head_dim: int, group: int, page_size: int, device: torch.device) -> dict:
    """Stage 1's launch parameters (kernels/tuning.py): BLOCK_N, num_warps, num_stages and MIN_TOKENS_PER_SPLIT."""
    return {"MIN_TOKENS_PER_SPLIT": MIN_TOKENS_PER_SPLIT,
            **get_config("paged_decode_stage1", f"head_dim={head_dim},group={group},page_size={page_size}", device,
                         _DEFAULT_STAGE1)}


def _decode_att_stage1(q, k_cache, v_cache, block_tables, seq_lens, scale, mid_o, mid_lse, out, tickets, cfg):
    batch, num_q_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    num_splits = mid_o.shape[2]
    assert mid_o.shape == (batch, num_q_heads, num_splits, head_dim) and mid_o.dtype == torch.float32
    assert mid_lse.shape == (batch, num_q_heads, num_splits) and mid_lse.dtype == torch.float32
    assert mid_o.stride(-1) == 1 and mid_lse.stride(-1) == 1
    group = num_q_heads // num_kv_heads
    cfg = dict(cfg)
    block_n, min_tokens = cfg.pop("BLOCK_N"), cfg.pop("MIN_TOKENS_PER_SPLIT")
    grid = (batch, num_kv_heads, num_splits)
    _paged_decode_stage1[grid](
        q, k_cache, v_cache, block_tables, seq_lens, mid_o, mid_lse, out, tickets,
        scale * LOG2E, num_splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group, BLOCK_G=_group_block(group), HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim), PAGE_SIZE=page_size, BLOCK_N=block_n,
        DOT_DTYPE=dot_dtype(k_cache.dtype, q.device),
        DOT_PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32",
        MERGE_G=triton.next_power_of_2(group), MERGE_CHUNK=merge_chunk(group, head_dim, cfg.get("num_warps", 4), 4),
        MIN_TILES=max(1, min_tokens // block_n), **cfg,
    )


def decode_reduce(mid_o: torch.Tensor, mid_lse: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Stage 2 launcher: merge partials `mid_o [B, Hq, P, D]`, `mid_lse [B, Hq, P]` (log2 units)
    into the caller-allocated `out [B, Hq, D]`."""
    batch, num_q_heads, num_partials, head_dim = mid_o.shape
    assert mid_lse.shape == (batch, num_q_heads, num_partials)
    assert out.shape == (batch, num_q_heads, head_dim) and out.stride(-1) == 1
    assert mid_o.stride(-1) == 1 and mid_lse.stride(-1) == 1
    _decode_reduce_stage2[(batch, num_q_heads)](
        mid_o, mid_lse, out,
        num_partials,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        BLOCK_P=triton.next_power_of_2(num_partials),
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=1 if head_dim <= 128 else 2,
    )
    return out


def merge_chunk(group: int, head_dim: int, num_warps: int, registers: int = 128) -> int:
    """Partials `merge_if_last` reads per step: [group, chunk, head_dim] fp32 at about `registers` a thread. The
    paged kernel takes 4: its loop needs 58 registers on sm_90, and a wider merge would set the kernel's count
    (128 at 16 partials a step, 220 at 32), fewer programs per SM; the ALR-KVD kernel's loop needs 255 anyway."""
    per_step = registers * 32 * num_warps // (triton.next_power_of_2(group) * triton.next_power_of_2(head_dim))
    return max(1, min(32, per_step))


def decode_tickets(tickets: torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor:
    """The merge's tickets (`merge_if_last`): the caller's buffer of int32 zeros (the engine keeps one, so a
    CUDA graph replays no memset), or new zeros."""
    if tickets is None:
        return torch.zeros(n, dtype=torch.int32, device=device)
    assert tickets.dtype == torch.int32 and tickets.is_contiguous() and tickets.numel() >= n
    assert tickets.device == device
    return tickets


def check_decode_inputs(q, block_tables, seq_lens, num_kv_heads: int, head_dim: int) -> None:
    """Shape/dtype checks common to every decode-attention format."""
    assert q.dim() == 3 and q.shape[2] == head_dim, f"q {tuple(q.shape)} vs head_dim {head_dim}"
    assert q.stride(-1) == 1, "q's head_dim must be contiguous"
    assert q.shape[1] % num_kv_heads == 0, "num_q_heads must be a multiple of num_kv_heads"
    assert block_tables.dtype == torch.int32 and block_tables.dim() == 2
    assert block_tables.shape[0] == q.shape[0] and block_tables.stride(-1) == 1
    assert seq_lens.dtype == torch.int32 and seq_lens.shape == (q.shape[0],)
    assert q.device == block_tables.device == seq_lens.device


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    tickets: torch.Tensor | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """Decode attention of `q [B, Hq, D]` over the paged `k_cache`/`v_cache`
    `[num_blocks, block_size, Hkv, D]` (keys rotated); returns `[B, Hq, D]` in q's dtype.

    `num_splits`: programs per (sequence, kv head); default from the shapes (`default_num_splits`).
    `config`: stage 1's launch parameters (`stage1_config`'s keys; default: the tuned or default ones).
    `tickets`: int32 zeros of at least B x Hkv entries, 0 again after the call (`decode_tickets`); None
    allocates them. One launch (the splits merged by the last of them), no host synchronisation: safe under
    CUDA-graph capture.
    """
    batch, num_q_heads, head_dim = q.shape
    num_blocks, page_size, num_kv_heads, _ = k_cache.shape
    check_decode_inputs(q, block_tables, seq_lens, num_kv_heads, head_dim)
    assert k_cache.shape == v_cache.shape and k_cache.shape[3] == head_dim
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert k_cache.dtype == v_cache.dtype and q.device == k_cache.device
    cfg = config or stage1_config(head_dim, num_q_heads // num_kv_heads, page_size, q.device)
    if num_splits is None:
        num_splits = default_num_splits(batch, num_kv_heads, block_tables.shape[1] * page_size, q.device,
                                        cfg["MIN_TOKENS_PER_SPLIT"])
    mid_o = torch.empty(batch, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(batch, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
    out = torch.empty(batch, num_q_heads, head_dim, dtype=q.dtype, device=q.device)
    tickets = decode_tickets(tickets, batch * num_kv_heads, q.device)
    _decode_att_stage1(q, k_cache, v_cache, block_tables, seq_lens, scale, mid_o, mid_lse, out, tickets, cfg)
    return out


# ----------------------------------------------------------------------------------------------
# Query tiles: a step's prompt chunks and decode tokens in one launch (CUDA-graph mixed steps)
# ----------------------------------------------------------------------------------------------
# (ints that vary with the batch are not specialized: outside a graph, each new combination of ==1 and
# multiple-of-16 would compile the kernel again, as it did the ALR-KVD kernel's, journal 2026-12-05 20c)
@triton.jit(do_not_specialize=["num_splits", "stride_btb", "stride_mlb", "stride_mlh"])
def _paged_tiles_stage1(
    # Pointers to tensors
    Q, K_cache, V_cache, Block_tables, Seq_lens, Tile_starts, Tile_counts, Mid_o, Mid_lse,
    # Scalars
    qk_scale, num_splits,
    # Strides
    stride_qb, stride_qh,
    stride_kn, stride_kt, stride_kh,
    stride_vn, stride_vt, stride_vh,
    stride_btb,
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    # Meta-parameters
    GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr,  # query tokens per tile
    BLOCK_M: tl.constexpr,  # BLOCK_Q x GROUP padded to a power of two: the rows of tl.dot, (token, head) pairs
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MIN_TILES: tl.constexpr,  # the fewest key tiles a split takes
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Grid (tiles, num_kv_heads, num_splits). A tile is up to BLOCK_Q consecutive query rows of one
    sequence (a prompt chunk's tokens, or one decode token); row r attends to the first Seq_lens[r]
    tokens of the block table of the tile's first row, so a chunk is causal. Each K/V tile is read once
    for all of the tile's tokens and heads. Writes the partials of each row, as stage 1 of decode."""
    pid_t = tl.program_id(0)
    pid_kvh = tl.program_id(1)
    pid_s = tl.program_id(2)
    count = tl.load(Tile_counts + pid_t)
    if count == 0:  # a tile the step does not use (the grid is fixed for a CUDA graph)
        return
    row0 = tl.load(Tile_starts + pid_t).to(tl.int64)

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    token = offs_m // GROUP
    mask_m = (token < count) & (offs_m < BLOCK_Q * GROUP)
    mask_d = offs_d < HEAD_DIM
    rows = row0 + token
    heads = pid_kvh * GROUP + offs_m % GROUP
    limit = tl.load(Seq_lens + rows, mask=mask_m, other=0)  # keys each row sees

    # -- this split's keys: whole tiles of the tile's longest context, at least MIN_TILES (the last splits of a
    # short context stay empty)
    ctx = tl.max(limit, 0)
    tiles_per_split = tl.maximum(tl.cdiv(tl.cdiv(ctx, BLOCK_N), num_splits), MIN_TILES)
    start = pid_s * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, ctx)

    q = tl.load(Q + rows[:, None] * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    q = q.to(K_cache.dtype.element_ty).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    bt_row = Block_tables + row0 * stride_btb
    k_head = K_cache + pid_kvh.to(tl.int64) * stride_kh
    v_head = V_cache + pid_kvh.to(tl.int64) * stride_vh
    for start_n in range(start, end, BLOCK_N):
        tok, mask_n, k, v = load_kv_tile(bt_row, k_head, v_head, start_n, end, offs_n, offs_d, mask_d,
                                         stride_kn, stride_kt, stride_vn, stride_vt, PAGE_SIZE)
        s = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION) * qk_scale
        # causal: a row sees only its own context; a row may see nothing of this tile (its max stays -inf)
        s = tl.where(mask_n[None, :] & (tok[None, :] < limit[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype).to(DOT_DTYPE), v.to(DOT_DTYPE),
                                            input_precision=DOT_PRECISION)
        m_i = m_new

    nonempty = l_i > 0
    l_safe = tl.where(nonempty, l_i, 1.0)
    lse = tl.where(nonempty, m_i + tl.log2(l_safe), float("-inf"))
    tl.store(Mid_o + rows[:, None] * stride_mob + heads[:, None] * stride_moh + pid_s * stride_mos + offs_d[None, :],
             acc / l_safe[:, None], mask=(mask_m & nonempty)[:, None] & mask_d[None, :])  # (stage 2 skips -inf)
    tl.store(Mid_lse + rows * stride_mlb + heads * stride_mlh + pid_s, lse, mask=mask_m)


TILE_ROWS = 64  # (token, head) rows of a query tile: BLOCK_Q = TILE_ROWS // group tokens


# A tiles launch splits each tile's keys over programs, at least TILE_SPLIT_TOKENS each: a decode row or a chunk's
# tile over a long history would otherwise be one program's serial loop (at a graph's 322 tiles the wave count
# gave one split; journal 2026-12-06 27a). The fp32 partials of every row for every split cost memory: at most
# TILE_PARTIALS_BYTES of them.
TILE_SPLIT_TOKENS = 1024
TILE_PARTIALS_BYTES = 256 << 20


def tile_num_splits(rows: int, num_q_heads: int, head_dim: int, max_len: int,
                    min_tokens: int = TILE_SPLIT_TOKENS) -> int:
    """Splits per (tile, kv head) of a tiles launch of `rows` query rows whose contexts reach `max_len` tokens
    (the block table's width): enough that splits of `min_tokens` cover `max_len`, as many as the partials'
    memory allows. Shapes only."""
    most = max(1, TILE_PARTIALS_BYTES // (rows * num_q_heads * head_dim * 4))
    return max(1, min(MAX_SPLITS, most, triton.cdiv(max_len, min_tokens)))


def tile_tokens(group: int) -> int:
    """Query tokens per tile for GQA groups of `group` heads (what `paged_tiles_attention`'s tiles may hold)."""
    return max(1, TILE_ROWS // group)


def query_tiles(query_lens: list[int], block_q: int, first_row: int = 0) -> tuple[list[int], list[int]]:
    """The tiles of at most `block_q` rows (`tile_tokens(group)` for `paged_tiles_attention`) of a step whose
    sequences bring `query_lens` consecutive query rows each: (starts, counts). Rows before `first_row` are in
    none (another launch reads them)."""
    starts, counts, row = [], [], 0
    for n in query_lens:
        for first in range(max(row, first_row), row + n, block_q):
            starts.append(first)
            counts.append(min(block_q, row + n - first))
        row += n
    return starts, counts


def paged_tiles_attention(q, k_cache, v_cache, block_tables, seq_lens, tile_starts, tile_counts, scale: float,
                          num_splits: int | None = None, block_n: int = 32, num_warps: int | None = None,
                          num_stages: int = 2, min_split_tokens: int = TILE_SPLIT_TOKENS) -> torch.Tensor:
    """Attention of the query rows `q [T, Hq, D]` of a step, each row r over the first `seq_lens[r]` tokens of
    its sequence's paged cache (`block_tables [T, W]`, a row per query row), grouped in tiles: tile i is
    rows tile_starts[i] .. + tile_counts[i] (at most `tile_tokens(group)`, consecutive rows of one sequence;
    count 0: unused). Every row must be in a tile. The result equals `paged_decode_attention` of the same
    rows; a tile reads each K/V tile once for all its tokens. Shapes only, no host sync: graph-safe.
    `block_n`, `num_warps`, `num_stages`: the launch (keys a loop step; at prefill shapes the best of eight tried
    was within 10% of the defaults, journal 2026-12-05 17a). `num_splits`: programs per (tile, kv head), each
    over at least `min_split_tokens` keys of the tile's context (default `tile_num_splits`)."""
    T, num_q_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    check_decode_inputs(q, block_tables, seq_lens, num_kv_heads, head_dim)
    assert tile_starts.shape == tile_counts.shape and tile_starts.dtype == tile_counts.dtype == torch.int32
    group = num_q_heads // num_kv_heads
    block_q = tile_tokens(group)
    block_m = max(16, triton.next_power_of_2(block_q * group))
    num_tiles = tile_starts.shape[0]
    if num_splits is None:
        num_splits = tile_num_splits(T, num_q_heads, head_dim, block_tables.shape[1] * page_size)
    mid_o = torch.empty(T, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(T, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
    out = torch.empty(T, num_q_heads, head_dim, dtype=q.dtype, device=q.device)
    _paged_tiles_stage1[(num_tiles, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, tile_starts, tile_counts, mid_o, mid_lse,
        scale * LOG2E, num_splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        GROUP=group, BLOCK_Q=block_q, BLOCK_M=block_m, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
        PAGE_SIZE=page_size, BLOCK_N=block_n, MIN_TILES=max(1, min_split_tokens // block_n),
        DOT_DTYPE=dot_dtype(k_cache.dtype, q.device),
        DOT_PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32",
        num_warps=num_warps or (4 if block_m <= 64 else 8), num_stages=num_stages,  # acc [BLOCK_M, D] fp32
    )
    return decode_reduce(mid_o, mid_lse, out)


# ----------------------------------------------------------------------------------------------
# The step's new keys and values into the cache
# ----------------------------------------------------------------------------------------------
@triton.jit
def _store_kv_kernel(K, V, K_dst, V_dst, Rows, Offsets, stride_kt, stride_vt, stride_dn, stride_dt,
                     ROW: tl.constexpr, BLOCK: tl.constexpr):
    """Grid (T,): token t's H x D keys and values into row Rows[t], position Offsets[t] of the destinations."""
    t = tl.program_id(0)
    dst = tl.load(Rows + t).to(tl.int64) * stride_dn + tl.load(Offsets + t).to(tl.int64) * stride_dt
    cols = tl.arange(0, BLOCK)
    mask = cols < ROW
    k = tl.load(K + t * stride_kt + cols, mask=mask)
    v = tl.load(V + t * stride_vt + cols, mask=mask)
    tl.store(K_dst + dst + cols, k.to(K_dst.dtype.element_ty), mask=mask)
    tl.store(V_dst + dst + cols, v.to(V_dst.dtype.element_ty), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_dst: torch.Tensor, v_dst: torch.Tensor, rows: torch.Tensor,
             offsets: torch.Tensor) -> None:
    """k_dst[rows[t], offsets[t]] = k[t] and the same for v, cast to the destination's dtype, in one launch
    (two indexed assignments in PyTorch). k, v [T, H, D], each token's H x D contiguous; k_dst, v_dst
    [N, block, H, D] alike (a layer's paged blocks, or its window slots); rows, offsets [T] int."""
    T, H, D = k.shape
    assert v.shape == k.shape and k_dst.shape == v_dst.shape and k_dst.shape[2:] == (H, D)
    assert k.stride()[1:] == (D, 1) and v.stride()[1:] == (D, 1) and k_dst.stride() == v_dst.stride()
    assert k_dst.stride()[2:] == (D, 1) and rows.shape == offsets.shape == (T,)
    _store_kv_kernel[(T,)](k, v, k_dst, v_dst, rows, offsets, k.stride(0), v.stride(0), k_dst.stride(0),
                           k_dst.stride(1), ROW=H * D, BLOCK=triton.next_power_of_2(H * D),
                           num_warps=4 if H * D >= 1024 else 1)


def store_kv_ref(k, v, k_dst, v_dst, rows, offsets) -> None:
    """`store_kv` by indexing."""
    k_dst[rows, offsets] = k.to(k_dst.dtype)
    v_dst[rows, offsets] = v.to(v_dst.dtype)


# ----------------------------------------------------------------------------------------------
# PyTorch reference
# ----------------------------------------------------------------------------------------------
def gather_paged(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One sequence's `[seq_len, H, D]` rows of a paged `[num_blocks, block_size, H, D]` cache."""
    block_size = cache.shape[1]
    blocks = block_table[: math.ceil(seq_len / block_size)].long()
    return cache[blocks].flatten(0, 1)[:seq_len]


def attend_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """fp32 attention of one token `q [Hq, D]` over `k, v [L, Hkv, D]` (GQA by repeat); `[Hq, D]`."""
    group = q.shape[0] // k.shape[1]
    if k.shape[0] == 0:
        return torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    k = k.float().repeat_interleave(group, dim=1)  # [L, Hq, D]
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,lhd->hl", q.float(), k) * scale
    return torch.einsum("hl,lhd->hd", scores.softmax(-1), v)


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
) -> torch.Tensor:
    """The same contract as `paged_decode_attention`, in fp32 PyTorch (the engine's CPU path).
    `num_splits` is accepted and ignored."""
    out = torch.empty_like(q)
    for b, seq_len in enumerate(seq_lens.tolist()):
        k = gather_paged(k_cache, block_tables[b], seq_len)
        v = gather_paged(v_cache, block_tables[b], seq_len)
        out[b] = attend_ref(q[b], k, v, scale).to(q.dtype)
    return out
