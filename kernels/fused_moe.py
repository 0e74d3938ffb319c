"""Fused mixture-of-experts (Triton): one grouped-GEMM launch per projection for all experts.

The (token, expert) pairs of a step are sorted by expert and each expert's run is padded to a
multiple of BLOCK_SIZE_M (`moe_align_block_size`), so every M-tile of the sorted order belongs to
one expert; a program multiplies its tile by that expert's weights. Two launches per MoE layer:
    act   = silu(x W_gate^T) * (x W_up^T)        gate and up fused: `w13` holds [gate; up] rows
    pairs = routed_weight * (act W_down^T)       one row per (token, expert) pair
then out[t] = sum over the token's top_k pairs. Expert weights are read through a slot map: the
weight pools hold `num_slots` experts (an expert cache, backend/experts.py), `slot_map[e]` is the
slot holding expert e, or -1 for an expert this call must skip (its pairs' rows are left alone,
to be written by another pass over other slots). With all experts resident, `slot_map` is None
and the pools are the stacked experts [E, ...] (expert e in slot e: nothing to read or build).

Layout:
    x             [T, H]            activations
    w13           [S, 2I, H]        per slot: gate rows [0, I), up rows [I, 2I)
    w2            [S, H, I]         per slot: down projection
    topk_weights  [T, top_k]        routing weights;  topk_ids [T, top_k] int (expert ids)
    slot_map      [E] int32         expert -> slot, -1: not in this pass
    returns       [T, H] in x's dtype, or the unreduced pairs [T, top_k, H] (`reduce=False`: the
                  next RMSNorm sums them, kernels/norms.py, one launch fewer)
Public: `moe_align_block_size`, `fused_moe` (dispatcher), `fused_moe_pass` (one pass over the
slots in `slot_map`, caller-allocated scratch) and `fused_moe_ref` (PyTorch). Nothing runs at
import. After vLLM's `fused_moe.py` / `moe_align_block_size.py` (sorted ids padded per expert,
early exit past `num_tokens_post_padded`), written anew: gate/up fused with SiLU in the epilogue,
the slot indirection, int64 offsets, tiles from kernels/tuning.py.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.moe_reference import grouped_experts
from kernels.paged_attention import dot_dtype
from kernels.tuning import get_config


# ----------------------------------------------------------------------------------------------
# Kernel: one grouped GEMM over the expert-sorted pairs
# ----------------------------------------------------------------------------------------------
@triton.jit
def _fused_moe_kernel(
    # Pointers to matrices
    A, B, C, Topk_weights, Sorted_token_ids, Expert_ids, Num_tokens_post_padded, Slot_map,
    # Matrix dimensions
    N,  # output columns (I for the gate/up pass, H for the down pass)
    K,  # reduction (H, then I)
    EM,  # length of Sorted_token_ids (a multiple of BLOCK_SIZE_M)
    num_valid_tokens,  # T * top_k: sorted ids >= this are padding
    # Strides
    stride_am, stride_ak,
    stride_bs, stride_bn, stride_bk,  # B [S, N (x2 for GLU), K]
    stride_cm, stride_cn,
    # Meta-parameters
    TOP_K: tl.constexpr,  # pair p reads A row p // TOP_K
    HAS_SLOT_MAP: tl.constexpr,  # False: expert e is in slot e
    GLU: tl.constexpr,  # B rows [0, N) gate, [N, 2N) up: C = silu(A gate^T) * (A up^T)
    MUL_ROUTED_WEIGHT: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,  # "ieee" for fp32 operands (no TF32), else "tf32" (ignored for 16-bit)
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):
    """1-D grid over (M-tiles of the sorted pairs) x (N-tiles). C [T * top_k, N]: row p is pair p."""
    # -- program id -> (M-tile, N-tile), grouped ordering for L2 reuse
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(EM, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # -- tiles past the padded pairs, and experts skipped in this pass, do nothing
    num_tokens_post_padded = tl.load(Num_tokens_post_padded)
    if pid_m * BLOCK_SIZE_M >= num_tokens_post_padded:
        return
    expert = tl.load(Expert_ids + pid_m)
    if expert < 0:
        return
    slot = expert.to(tl.int64)
    if HAS_SLOT_MAP:
        slot = tl.load(Slot_map + expert).to(tl.int64)
        if slot < 0:
            return

    # -- the tile's pairs and their rows of A
    offs_token_id = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_token = tl.load(Sorted_token_ids + offs_token_id).to(tl.int64)
    token_mask = offs_token < num_valid_tokens
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = A + (offs_token[:, None] // TOP_K) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = B + slot * stride_bs + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None] * stride_bk

    # -- fp32 accumulation over K
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    if GLU:
        acc_up = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k_mask = offs_k < K - k * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=token_mask[:, None] & k_mask[None, :], other=0.0).to(DOT_DTYPE)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0).to(DOT_DTYPE)
        acc += tl.dot(a, b, input_precision=PRECISION)
        if GLU:
            b_up = tl.load(b_ptrs + N * stride_bn, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
            acc_up += tl.dot(a, b_up.to(DOT_DTYPE), input_precision=PRECISION)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    # -- epilogue: SiLU gate, routing weight, store the pairs' rows
    if GLU:
        acc = acc * tl.sigmoid(acc) * acc_up
    if MUL_ROUTED_WEIGHT:
        w = tl.load(Topk_weights + offs_token, mask=token_mask, other=0.0)
        acc = acc * w.to(tl.float32)[:, None]
    c_ptrs = C + offs_token[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=token_mask[:, None] & n_mask[None, :])


# ----------------------------------------------------------------------------------------------
# Preparation: sort the pairs by expert, pad each expert's run to BLOCK_SIZE_M
# ----------------------------------------------------------------------------------------------
class MoEAlignment(NamedTuple):
    sorted_token_ids: torch.Tensor  # [EM] int32: pair ids grouped by expert, padding = T * top_k
    expert_ids: torch.Tensor  # [EM // block_size] int32: expert of each M-tile, -1 past the end
    num_tokens_post_padded: torch.Tensor  # [1] int32: padded pairs actually used
    block_size: int


@triton.jit
def _count_pairs(Ids, Pair_weights, lo, hi, numel, e, BLOCK_E: tl.constexpr, BLOCK: tl.constexpr,
                 HAS_COUNTS: tl.constexpr):
    """Pairs lo .. hi - 1 (those below numel), BLOCK at a time: how many go to each expert e, and with HAS_COUNTS
    the sum of their Pair_weights per expert (whole numbers: exact in fp32)."""
    chunk = tl.arange(0, BLOCK)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    weighted = tl.zeros([BLOCK_E], dtype=tl.float32)
    for start in range(lo, hi, BLOCK):
        mask = start + chunk < numel
        ids = tl.load(Ids + start + chunk, mask=mask, other=-1)
        onehot = (ids[:, None] == e[None, :]).to(tl.int32)
        counts += tl.sum(onehot, axis=0)
        if HAS_COUNTS:
            w = tl.load(Pair_weights + start + chunk, mask=mask, other=0.0).to(tl.float32)
            weighted += tl.sum(onehot.to(tl.float32) * w[:, None], axis=0)
    return counts, weighted


@triton.jit
def _store_tile_experts(Expert_ids, ends, e, lo, hi, num_tiles, E: tl.constexpr, BLOCK: tl.constexpr,
                        BLOCK_SIZE: tl.constexpr):
    """M-tiles lo .. hi - 1 (those below num_tiles): each tile's expert, how many runs end at or before the tile's
    start (-1 past the last run)."""
    for t0 in range(lo, hi, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        before = tl.sum(((ends[None, :] <= t[:, None] * BLOCK_SIZE) & (e[None, :] < E)).to(tl.int32), axis=1)
        tl.store(Expert_ids + t, tl.where(before < E, before, -1), mask=(t < num_tiles) & (t < hi))


@triton.jit
def _place_pairs(Ids, Sorted, lo, hi, numel, e, seen, BLOCK: tl.constexpr):
    """Pairs lo .. hi - 1 (those below numel) into Sorted: pair i of expert e at seen[e] + how many pairs of e came
    before it from lo on (a one-hot prefix sum per BLOCK of pairs)."""
    chunk = tl.arange(0, BLOCK)
    for start in range(lo, hi, BLOCK):
        ids = tl.load(Ids + start + chunk, mask=start + chunk < numel, other=-1)
        onehot = (ids[:, None] == e[None, :]).to(tl.int32)
        before = tl.cumsum(onehot, axis=0) - onehot  # earlier pairs of the same expert in this block
        dest = tl.sum(onehot * (seen[None, :] + before), axis=1)
        tl.store(Sorted + dest, start + chunk, mask=start + chunk < numel)
        seen += tl.sum(onehot, axis=0)


@triton.jit
def _moe_align_kernel(Ids, Sorted, Expert_ids, Num_post_padded, Counts, Pair_weights, numel, em,
                      E: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK: tl.constexpr, FILL_BLOCK: tl.constexpr,
                      BLOCK_SIZE: tl.constexpr, HAS_COUNTS: tl.constexpr):
    """One program: count the pairs per expert (with HAS_COUNTS, Counts[e] += the Pair_weights of expert e's
    pairs), pad the runs, then place each pair at its expert's run start + how many pairs of that expert came
    before it."""
    e = tl.arange(0, BLOCK_E)
    counts, weighted = _count_pairs(Ids, Pair_weights, 0, numel, numel, e, BLOCK_E, BLOCK, HAS_COUNTS)
    if HAS_COUNTS:
        total = tl.load(Counts + e, mask=e < E, other=0.0)
        tl.store(Counts + e, total + weighted.to(total.dtype), mask=e < E)
    padded = (counts + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    tl.store(Num_post_padded, tl.sum(padded, axis=0))
    _store_tile_experts(Expert_ids, ends, e, 0, em // BLOCK_SIZE, em // BLOCK_SIZE, E, BLOCK, BLOCK_SIZE)
    fill = tl.arange(0, FILL_BLOCK)
    for start in range(0, em, FILL_BLOCK):
        tl.store(Sorted + start + fill, numel, mask=start + fill < em)
    tl.debug_barrier()  # the padding is written before any pair
    _place_pairs(Ids, Sorted, 0, numel, numel, e, starts, BLOCK)


def padded_pairs(numel: int, block_size: int, num_experts: int) -> int:
    """Room for `numel` pairs sorted by expert, each expert's run padded to `block_size`: at most min(numel, E)
    experts have pairs, each padded by at most block_size - 1. (Bounding by E alone gave a decode step's 8 pairs of
    128 experts 121 M-tiles, 113 of them empty programs in every launch of the fused MoE.)"""
    return triton.cdiv(numel + min(numel, num_experts) * (block_size - 1), block_size) * block_size


# Many pairs (prompt chunks): programs of CHUNK_PAIRS pairs each, in two launches: each counts its pairs per expert,
# then each places its pairs after the runs' starts and the earlier programs' pairs of the same expert.
@triton.jit
def _moe_count_kernel(Ids, Partial, Weighted, Pair_weights, numel,
                      BLOCK_E: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, HAS_COUNTS: tl.constexpr):
    """Program p: Partial[p, e] = how many of pairs [p * CHUNK, (p + 1) * CHUNK) go to expert e (with HAS_COUNTS,
    Weighted[p, e] = the sum of their Pair_weights)."""
    p = tl.program_id(0)
    e = tl.arange(0, BLOCK_E)
    counts, weighted = _count_pairs(Ids, Pair_weights, p * CHUNK, (p + 1) * CHUNK, numel, e, BLOCK_E, BLOCK,
                                    HAS_COUNTS)
    tl.store(Partial + p * BLOCK_E + e, counts)
    if HAS_COUNTS:
        tl.store(Weighted + p * BLOCK_E + e, weighted)


@triton.jit
def _moe_place_kernel(Ids, Sorted, Expert_ids, Num_post_padded, Partial, Counts, Weighted, numel, em, num_programs,
                      E: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
                      BLOCK_P: tl.constexpr, BLOCK_SIZE: tl.constexpr, HAS_COUNTS: tl.constexpr):
    """Program p: the runs' padded starts from every program's counts, then pair i of expert e of its chunk goes to
    start[e] + e's pairs in earlier programs + e's earlier pairs in this chunk; its share of the M-tiles' experts.
    `Sorted` holds the padding value already."""
    p = tl.program_id(0)
    e = tl.arange(0, BLOCK_E)
    totals = tl.zeros([BLOCK_E], dtype=tl.int32)
    earlier = tl.zeros([BLOCK_E], dtype=tl.int32)
    weighted = tl.zeros([BLOCK_E], dtype=tl.float32)
    for q0 in range(0, num_programs, BLOCK_P):
        q = q0 + tl.arange(0, BLOCK_P)
        part = tl.load(Partial + q[:, None] * BLOCK_E + e[None, :], mask=q[:, None] < num_programs, other=0)
        totals += tl.sum(part, axis=0)
        earlier += tl.sum(tl.where(q[:, None] < p, part, 0), axis=0)
        if HAS_COUNTS:
            weighted += tl.sum(tl.load(Weighted + q[:, None] * BLOCK_E + e[None, :], mask=q[:, None] < num_programs,
                                       other=0.0), axis=0)
    padded = (totals + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    if p == 0:
        tl.store(Num_post_padded, tl.sum(padded, axis=0))
        if HAS_COUNTS:
            total = tl.load(Counts + e, mask=e < E, other=0.0)
            tl.store(Counts + e, total + weighted.to(total.dtype), mask=e < E)
    num_tiles = em // BLOCK_SIZE
    share = tl.cdiv(num_tiles, num_programs)
    _store_tile_experts(Expert_ids, ends, e, p * share, (p + 1) * share, num_tiles, E, BLOCK, BLOCK_SIZE)
    _place_pairs(Ids, Sorted, p * CHUNK, (p + 1) * CHUNK, numel, e, starts + earlier, BLOCK)


# One program walks every pair: a decode step's few hundred pairs in one launch; more, in programs of CHUNK_PAIRS.
ALIGN_ONE_PROGRAM_MAX_PAIRS = 256
CHUNK_PAIRS = 256


def moe_align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int,
                         counts: tuple[torch.Tensor, torch.Tensor] | None = None) -> MoEAlignment:
    """Sort the pairs of `topk_ids [T, top_k]` by expert, each expert's run padded to a multiple of
    `block_size`, pairs of one expert in their order. Static output sizes (EM: `padded_pairs`), no host sync.
    One Triton launch up to ALIGN_ONE_PROGRAM_MAX_PAIRS pairs, else a fill and two launches of CHUNK_PAIRS a program.
    `counts`: (totals [E], pair weights [>= T*top_k]), floats: totals[e] += the weights of expert e's pairs
    (routing statistics in the same launch; weights 1, or 0 for a CUDA graph's padding rows).

    Example: topk_ids [[2, 0], [2, 1]] (pairs 0..3), block_size 2, 3 experts ->
        sorted_token_ids [1, 4, 3, 4, 0, 2, ...padding 4]   (expert 0: pair 1; 1: pair 3; 2: pairs 0, 2)
        expert_ids       [0, 1, 2, -1, ...]                 num_tokens_post_padded [6]
    """
    numel = topk_ids.numel()
    em = padded_pairs(numel, block_size, num_experts)
    device = topk_ids.device
    expert_ids = torch.empty(em // block_size, dtype=torch.int32, device=device)
    num_post_padded = torch.empty(1, dtype=torch.int32, device=device)
    totals, pair_weights = counts if counts is not None else (expert_ids, expert_ids)
    if counts is not None:
        assert totals.shape == (num_experts,) and totals.is_contiguous() and totals.is_floating_point()
        assert pair_weights.numel() >= numel and pair_weights.is_contiguous()
    ids = topk_ids.contiguous()
    block_e = triton.next_power_of_2(num_experts)
    if numel <= ALIGN_ONE_PROGRAM_MAX_PAIRS:
        sorted_token_ids = torch.empty(em, dtype=torch.int32, device=device)
        _moe_align_kernel[(1,)](ids, sorted_token_ids, expert_ids, num_post_padded, totals, pair_weights, numel, em,
                                E=num_experts, BLOCK_E=block_e, BLOCK=64, FILL_BLOCK=1024, BLOCK_SIZE=block_size,
                                HAS_COUNTS=counts is not None, num_warps=4)
    else:
        sorted_token_ids = torch.full((em,), numel, dtype=torch.int32, device=device)
        programs = triton.cdiv(numel, CHUNK_PAIRS)
        partial = torch.empty(programs, block_e, dtype=torch.int32, device=device)
        weighted = torch.empty(programs, block_e, dtype=torch.float32, device=device) if counts is not None else partial
        _moe_count_kernel[(programs,)](ids, partial, weighted, pair_weights, numel, BLOCK_E=block_e, BLOCK=64,
                                       CHUNK=CHUNK_PAIRS, HAS_COUNTS=counts is not None, num_warps=4)
        _moe_place_kernel[(programs,)](ids, sorted_token_ids, expert_ids, num_post_padded, partial, totals, weighted,
                                       numel, em, programs, E=num_experts, BLOCK_E=block_e, BLOCK=64,
                                       CHUNK=CHUNK_PAIRS, BLOCK_P=16, BLOCK_SIZE=block_size,
                                       HAS_COUNTS=counts is not None, num_warps=4)
    return MoEAlignment(sorted_token_ids, expert_ids, num_post_padded, block_size)


def moe_align_ref(topk_ids: torch.Tensor, block_size: int, num_experts: int,
                  counts: tuple[torch.Tensor, torch.Tensor] | None = None) -> MoEAlignment:
    """`moe_align_block_size` in PyTorch (a stable sort), for any device and size."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    numel = flat.numel()
    em = padded_pairs(numel, block_size, num_experts)
    per_expert = flat.new_zeros(num_experts).scatter_add_(0, flat, torch.ones_like(flat))  # bincount syncs on CUDA
    if counts is not None:
        counts[0].index_add_(0, flat, counts[1][:numel].to(counts[0].dtype))
    padded = (per_expert + block_size - 1) // block_size * block_size
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    first = torch.cumsum(per_expert, 0) - per_expert  # index in `order` of each expert's first pair
    rank = torch.arange(numel, device=device) - first[sorted_experts]
    sorted_token_ids = torch.full((em,), numel, dtype=torch.int32, device=device)
    sorted_token_ids[starts[sorted_experts] + rank] = order.to(torch.int32)
    tile_starts = torch.arange(0, em, block_size, device=device)
    expert_ids = torch.searchsorted(ends, tile_starts, right=True)
    expert_ids = torch.where(expert_ids < num_experts, expert_ids, -1).to(torch.int32)
    return MoEAlignment(sorted_token_ids, expert_ids, ends[-1:].to(torch.int32), block_size)


@triton.jit
def _route_kernel(Logits, Routes, Keys, Valid, Weights, Ids, E, stride_logits,
                  Sorted, Expert_ids, Num_post_padded, Counts, Pair_weights,
                  TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                  SEEDED: tl.constexpr, NORMALIZE: tl.constexpr, HAS_VALID: tl.constexpr,
                  ALIGN: tl.constexpr, BLOCK_SIZE: tl.constexpr, HAS_COUNTS: tl.constexpr):
    """One program per token: softmax over the experts in fp32, then the top k (or the experts of the
    token's row of Routes, with their probabilities), renormalized over the k when asked. With HAS_VALID, a
    row whose Valid is 0 (a CUDA graph's padding) takes row 0's experts at weight 0. With ALIGN (one token,
    distinct experts): pair j alone in M-tile j, what `moe_align_block_size` gives sorted by pair instead of by
    expert, and with HAS_COUNTS Counts[expert] += the pair's Pair_weights."""
    out = tl.program_id(0)
    t = out
    if HAS_VALID:
        valid = tl.load(Valid + out) != 0
        t = tl.where(valid, out, 0)
    e = tl.arange(0, BLOCK_E)
    k = tl.arange(0, BLOCK_K)
    x = tl.load(Logits + t * stride_logits + e, mask=e < E, other=-float("inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = p / tl.sum(p, axis=0)
    if SEEDED:
        key = tl.load(Keys + t)
        ids = tl.load(Routes + key * TOP_K + k, mask=k < TOP_K, other=-1).to(tl.int64)
        w = tl.sum(tl.where(ids[:, None] == e[None, :], p[None, :], 0.0), axis=1)
    else:
        ids = tl.zeros([BLOCK_K], dtype=tl.int64)
        w = tl.zeros([BLOCK_K], dtype=tl.float32)
        left = tl.where(e < E, p, -1.0)
        for j in tl.static_range(TOP_K):
            best = tl.argmax(left, axis=0)
            ids = tl.where(k == j, best.to(tl.int64), ids)
            w = tl.where(k == j, tl.max(left, axis=0), w)
            left = tl.where(e == best, -1.0, left)
    if NORMALIZE:
        w = w / tl.sum(tl.where(k < TOP_K, w, 0.0), axis=0)
    if HAS_VALID:
        w = tl.where(valid, w, 0.0)
    tl.store(Weights + out * TOP_K + k, w.to(Weights.dtype.element_ty), mask=k < TOP_K)
    tl.store(Ids + out * TOP_K + k, ids, mask=k < TOP_K)
    if ALIGN:
        row = tl.arange(0, BLOCK_SIZE)
        tl.store(Sorted + k[:, None] * BLOCK_SIZE + row[None, :], tl.where(row[None, :] == 0, k[:, None], TOP_K),
                 mask=k[:, None] < TOP_K)  # a tile's rows after its pair: padding (the pair count)
        tl.store(Expert_ids + k, ids.to(tl.int32), mask=k < TOP_K)
        tl.store(Num_post_padded, TOP_K * BLOCK_SIZE)
        if HAS_COUNTS:
            ones = tl.load(Pair_weights + k, mask=k < TOP_K, other=0.0)
            tl.atomic_add(Counts + ids, ones.to(Counts.dtype.element_ty), mask=k < TOP_K)


def moe_route(logits: torch.Tensor, top_k: int, normalize: bool, routes: torch.Tensor | None = None,
              keys: torch.Tensor | None = None, valid: torch.Tensor | None = None, align: bool = False,
              counts: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Router logits [T, E] -> (weights [T, top_k] in the logits' dtype, ids [T, top_k] int64), in one
    launch: softmax in fp32, the top k (ties: the lower expert), weights renormalized to sum 1 when
    `normalize`. Seeded routing: token t takes the experts `routes[keys[t]]` ([buckets, top_k]) instead
    of its top k, their weights from the softmax all the same. `valid [T]` bool: rows where it is False (a CUDA
    graph's padding) take row 0's experts at weight 0, so they bring no expert of their own (two launches fewer
    than masking after). Equals kernels.moe_reference.moe_route_ref.
    `align` (one token): also its pairs' `MoEAlignment` for `fused_moe`, a tile each, and `counts` added to as
    `moe_align_block_size` would: a decode step at batch 1 saves the sort's launch in every MoE layer (its top k
    experts are distinct, so a tile per pair reads each once, as sorting would)."""
    T, E = logits.shape
    assert logits.stride(1) == 1
    weights = torch.empty(T, top_k, dtype=logits.dtype, device=logits.device)
    ids = torch.empty(T, top_k, dtype=torch.int64, device=logits.device)
    seeded = routes is not None
    if seeded:
        assert routes.is_contiguous() and routes.shape[1] == top_k and keys.shape == (T,)
    if valid is not None:
        assert valid.dtype == torch.bool and valid.shape == (T,) and valid.is_contiguous()
    alignment, totals, pair_weights = None, ids, ids
    if align:
        assert T == 1 and top_k <= E, "a tile per pair: one token's distinct experts"
        block_size = block_size_m(top_k, E)
        alignment = MoEAlignment(torch.empty(top_k * block_size, dtype=torch.int32, device=logits.device),
                                 torch.empty(top_k, dtype=torch.int32, device=logits.device),
                                 torch.empty(1, dtype=torch.int32, device=logits.device), block_size)
        if counts is not None:
            totals, pair_weights = counts
    _route_kernel[(T,)](logits, routes if seeded else ids, keys if seeded else ids, ids if valid is None else valid,
                        weights, ids, E, logits.stride(0), *(alignment[:3] if align else (ids, ids, ids)),
                        totals, pair_weights, TOP_K=top_k, BLOCK_E=triton.next_power_of_2(E),
                        BLOCK_K=triton.next_power_of_2(top_k), SEEDED=seeded, NORMALIZE=normalize,
                        HAS_VALID=valid is not None, ALIGN=align, BLOCK_SIZE=alignment.block_size if align else 1,
                        HAS_COUNTS=counts is not None, num_warps=4)
    return (weights, ids, alignment) if align else (weights, ids)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def block_size_m(num_pairs: int, num_experts: int) -> int:
    """M-tile shared by both projections: 16 for decode (a few pairs per expert), larger for prefill (128 from about
    100 pairs an expert: 1.18x 64's on gate/up at 2,048 and 8,192 tokens of Qwen3-30B-A3B, H100, journal
    2026-12-05 18a)."""
    per_expert = num_pairs / num_experts
    return 16 if per_expert <= 16 else 32 if per_expert <= 48 else 64 if per_expert <= 96 else 128


def moe_kernel_variant(num_pairs: int, num_experts: int) -> tuple[int, bool, bool]:
    """What a call's compiled kernels depend on besides the weights' shapes: the M-tile, the sort in one program or
    several, and whether the pair count is a multiple of 16 (Triton specializes integer arguments on it). A
    warm-up that runs each variant once leaves nothing to compile for a first prompt of any length."""
    return block_size_m(num_pairs, num_experts), num_pairs <= ALIGN_ONE_PROGRAM_MAX_PAIRS, num_pairs % 16 == 0


def _default_config(block_m: int, device: torch.device) -> dict:
    if device.type != "cuda":  # the interpreter: few, large programs (128 x 128: the layered graphs test 61 -> 33 s)
        return {"BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 1}
    if block_m == 16:  # decode: weight-streaming GEMV-like tiles, deep K
        return {"BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 4}
    return {"BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "num_warps": 8, "num_stages": 3}


def _launch(a, b, c, topk_weights, align: MoEAlignment, slot_map, num_valid: int, top_k: int,
            glu: bool, mul_routed_weight: bool):
    n = c.shape[1]
    k = a.shape[1]
    assert b.shape[1] == (2 * n if glu else n) and b.shape[2] == k, f"B {tuple(b.shape)} vs N={n}, K={k}"
    assert b.stride(2) == 1 and a.stride(1) == 1 and c.stride(1) == 1
    em = align.sorted_token_ids.shape[0]
    key = f"N={n},K={k},glu={int(glu)},M={align.block_size}"
    cfg = get_config("fused_moe", key, a.device, _default_config(align.block_size, a.device))
    dot_type = dot_dtype(b.dtype, a.device)
    grid = lambda meta: (triton.cdiv(em, align.block_size) * triton.cdiv(n, meta["BLOCK_SIZE_N"]),)  # noqa: E731
    _fused_moe_kernel[grid](
        a, b, c, topk_weights, align.sorted_token_ids, align.expert_ids, align.num_tokens_post_padded,
        align.expert_ids if slot_map is None else slot_map,
        n, k, em, num_valid,
        a.stride(0), a.stride(1),
        b.stride(0), b.stride(1), b.stride(2),
        c.stride(0), c.stride(1),
        TOP_K=top_k, HAS_SLOT_MAP=slot_map is not None, GLU=glu, MUL_ROUTED_WEIGHT=mul_routed_weight,
        DOT_DTYPE=dot_type, PRECISION="ieee" if dot_type == tl.float32 else "tf32", BLOCK_SIZE_M=align.block_size, **cfg,
    )


def fused_moe_pass(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   align: MoEAlignment, slot_map: torch.Tensor | None, act: torch.Tensor, pairs: torch.Tensor) -> None:
    """Compute the pairs whose expert has a slot in `slot_map` (-1: skipped; None: expert e in slot e): writes
    their rows of the caller-allocated scratch `act [T*top_k, I]` and `pairs [T*top_k, H]` (routing weight
    applied). Several passes over disjoint expert sets, with the slots refilled between them, fill `pairs`."""
    T, H = x.shape
    top_k = topk_weights.shape[1]
    I = w2.shape[2]
    assert act.shape == (T * top_k, I) and pairs.shape == (T * top_k, H)
    assert slot_map is None or (slot_map.dtype == torch.int32 and slot_map.is_contiguous()
                                and slot_map.device == x.device)
    assert topk_weights.is_contiguous() and x.device == w13.device
    _launch(x, w13, act, topk_weights, align, slot_map, T * top_k, top_k, glu=True, mul_routed_weight=False)
    _launch(act, w2, pairs, topk_weights, align, slot_map, T * top_k, 1, glu=False, mul_routed_weight=True)


def reduce_pairs(pairs: torch.Tensor, top_k: int, dtype: torch.dtype) -> torch.Tensor:
    """out[t] = sum of the token's top_k rows of `pairs`, summed in fp32."""
    return pairs.view(-1, top_k, pairs.shape[1]).sum(1, dtype=torch.float32).to(dtype)


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, slot_map: torch.Tensor | None = None,
              expert_counts: tuple[torch.Tensor, torch.Tensor] | None = None, reduce: bool = True,
              align: MoEAlignment | None = None) -> torch.Tensor:
    """MoE output `[T, H]` for `x [T, H]` routed to `topk_ids` with `topk_weights [T, top_k]`.
    `slot_map [E]` maps experts to slots of the pools `w13 [S, 2I, H]`, `w2 [S, H, I]`; every
    routed expert must have a slot. None: the pools are the stacked experts (E == S).
    `expert_counts`: (totals [E], pair weights), `moe_align_block_size`'s `counts`. `reduce=False`: the pairs
    `[T, top_k, H]` (routing weights applied) instead of their sum over top_k. `align`: the pairs' alignment
    already made (`moe_route(align=True)`, which counted them too), else sorted here."""
    T, H = x.shape
    top_k = topk_ids.shape[1]
    num_experts = w13.shape[0] if slot_map is None else slot_map.shape[0]
    if align is None:
        align = moe_align_block_size(topk_ids, block_size_m(T * top_k, num_experts), num_experts, expert_counts)
    act = torch.empty(T * top_k, w2.shape[2], dtype=x.dtype, device=x.device)
    pairs = torch.empty(T * top_k, H, dtype=x.dtype, device=x.device)
    fused_moe_pass(x, w13, w2, topk_weights.contiguous(), align, slot_map, act, pairs)
    return reduce_pairs(pairs, top_k, x.dtype) if reduce else pairs.view(T, top_k, H)


# ----------------------------------------------------------------------------------------------
# PyTorch reference
# ----------------------------------------------------------------------------------------------
def fused_moe_ref(x, w13, w2, topk_weights, topk_ids, slot_map=None) -> torch.Tensor:
    """The same contract as `fused_moe`, in fp32 PyTorch, one pair at a time (pairs whose expert
    has no slot contribute nothing)."""
    T, top_k = topk_ids.shape
    I = w2.shape[2]
    out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
    slots = slot_map.tolist() if slot_map is not None else list(range(w13.shape[0]))
    for t in range(T):
        for j in range(top_k):
            s = slots[int(topk_ids[t, j])]
            if s < 0:
                continue
            xt = x[t].float()
            g, u = w13[s, :I].float() @ xt, w13[s, I:].float() @ xt
            out[t] += topk_weights[t, j].float() * (w2[s].float() @ (F.silu(g) * u))
    return out.to(x.dtype)


# ----------------------------------------------------------------------------------------------
# Benchmark (GPU): `python -m kernels.fused_moe`
# ----------------------------------------------------------------------------------------------
def _bench_configs():
    return [triton.testing.Benchmark(
        x_names=["T"], x_vals=[1, 8, 64, 512], line_arg="provider", line_vals=["fused", "torch-loop"],
        line_names=["fused_moe (Triton)", "per-expert matmuls (PyTorch)"], ylabel="GB/s of weights read",
        plot_name=f"fused_moe-E{E}-H{H}-I{I}-k{k}", args={"E": E, "H": H, "I": I, "k": k})
        for E, H, I, k in [(8, 4096, 14336, 2), (128, 2048, 768, 8)]]


def bench_fused_moe(print_data: bool = True):
    """Weight bytes read per second of one MoE layer (distinct routed experts x expert bytes)."""
    @triton.testing.perf_report(_bench_configs())
    def bench(T, provider, E, H, I, k):
        dev, dt = torch.device("cuda"), torch.bfloat16
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(T, H, device=dev, dtype=dt, generator=g)
        w13 = torch.randn(E, 2 * I, H, device=dev, dtype=dt, generator=g) * H ** -0.5
        w2 = torch.randn(E, H, I, device=dev, dtype=dt, generator=g) * I ** -0.5
        probs = torch.rand(T, E, device=dev, generator=g).softmax(-1)
        weights, ids = torch.topk(probs, k, dim=-1)
        weights = weights.to(dt)
        if provider == "fused":
            fn = lambda: fused_moe(x, w13, w2, weights, ids)  # noqa: E731
        else:
            fn = lambda: grouped_experts(x, weights, ids, E, lambda e: (w13[e, :I], w13[e, I:], w2[e]))  # noqa: E731
        ms = triton.testing.do_bench(fn)
        used = int(torch.unique(ids).numel())
        return used * 3 * H * I * 2 / ms * 1e-6

    bench.run(print_data=print_data)


if __name__ == "__main__":
    bench_fused_moe()
