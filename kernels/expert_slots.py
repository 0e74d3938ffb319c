"""Expert-cache bookkeeping of one MoE layer in one Triton program (backend/graph_experts.py).

Deciding on the device which experts a step must copy takes some twenty small PyTorch ops (scatters, a
sort, cumulative sums); in a CUDA graph of a 48-layer model that is about 2,000 launches a step. This
kernel does the same in one launch per layer and pass. A layer's state (rows of the cache's tensors):
    slot_of [E + 1] int64   the slot (global pool row) holding expert e, or -1; entry E is scratch
    holder  [S + 1] int64   the expert in local slot j, E when empty; entry S is scratch
    stamp   [S + 1] int64   the step that last used slot j (LRU)
    uses    [E + 1] int64   how often expert e was routed (LFU)
    fresh   [S + 1] bool    slot j was filled by a prefetch and not used since
    predicted [E + 1] bool  the experts a prefetch placed for this layer, since its last run
    order   [E] int64       scratch: each routed expert's place in the layer's order of passes
Per call, with `ids [N]` the routed (or, prefetching, predicted) experts:
  - the experts of this pass: the routed ones, resident first, then by id, positions [p*S, (p+1)*S);
  - each missing one takes a slot no expert of the pass holds: empty first, then the oldest `stamp`
    (LRU) or the fewest `uses` then oldest (LFU); its former expert is evicted;
  - outputs: `slot_map [E]` int32 (run: the pass's experts' slots, -1 elsewhere), `copy_dst [E]` and
    `copy_valid [E]` for kernels/expert_copy.py (expert e to row copy_dst[e] where valid);
  - counters (`counts` [8] int64, in the order of the names below) and, on a layer's first pass, the
    clock (first layer: a new step), `uses` and the scoring of the last prediction.
`place_experts` launches it; `place_experts_ref` is the PyTorch reference (tests, the CPU path).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# the counters' order in `counts`; the kernel reads their indices as constants
COUNTERS = ("tokens", "hits", "misses", "prefetch_copies", "prefetch_useful", "predicted", "predicted_used",
            "used_with_prediction")
_HITS, _MISSES, _PREFETCH_COPIES, _PREFETCH_USEFUL, _PREDICTED, _PREDICTED_USED, _USED_WITH_PREDICTION = (
    tl.constexpr(COUNTERS.index(name)) for name in COUNTERS[1:])


@triton.jit
def _place_kernel(
    # Pointers: the layer's state, then the step's inputs and outputs
    Ids, Slot_of, Holder, Stamp, Uses, Fresh, Predicted, Order, Clock, Counts, Slot_map, Copy_dst, Copy_valid,
    # Sizes and scalars
    N, E, S, base, pass_index,
    # Meta-parameters
    PREFETCH: tl.constexpr, LFU: tl.constexpr, FIRST_LAYER: tl.constexpr, SCORE: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program. Every load comes before the barrier, every store after it."""
    offs_e = tl.arange(0, BLOCK_E)
    offs_s = tl.arange(0, BLOCK_S)
    in_e = offs_e < E
    in_s = offs_s < S
    # routed experts: any id equal to e
    used = tl.zeros([BLOCK_E], dtype=tl.int32)
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        ids = tl.load(Ids + offs_n, mask=offs_n < N, other=-1)
        used = tl.maximum(used, tl.max((ids[:, None] == offs_e[None, :]).to(tl.int32), axis=0))
    used = used > 0
    slot = tl.load(Slot_of + offs_e, mask=in_e, other=-1)
    holder = tl.load(Holder + offs_s, mask=in_s, other=E)
    stamp = tl.load(Stamp + offs_s, mask=in_s, other=0)
    fresh = tl.load(Fresh + offs_s, mask=in_s, other=0) != 0
    uses = tl.load(Uses + offs_e, mask=in_e, other=0)
    clock = tl.load(Clock)
    counts = tl.load(Counts + tl.arange(0, 8))
    resident = slot >= 0
    first_pass = pass_index == 0
    if not PREFETCH:
        if first_pass:
            uses += used.to(tl.int64)
            if FIRST_LAYER:
                clock += 1
    # the layer's order of passes: resident experts first, then by id (fixed on its first pass)
    hit0 = used & resident
    need0 = used & (slot < 0)
    position = tl.where(hit0, tl.cumsum(hit0.to(tl.int32), 0) - 1,
                        tl.sum(hit0.to(tl.int32), 0) + tl.cumsum(need0.to(tl.int32), 0) - 1)
    position = tl.where(used, position, E + S).to(tl.int64)
    if not PREFETCH:
        if not first_pass:
            position = tl.load(Order + offs_e, mask=in_e, other=E + S)
    want = used & (position >= pass_index * S) & (position < (pass_index + 1) * S)
    hit = want & resident
    need = want & (slot < 0)
    # slots no expert of this pass holds, ranked by age (empty first)
    holds = holder[:, None] == offs_e[None, :]  # [S, E]
    keep = tl.max((holds & want[None, :]).to(tl.int32), axis=1) > 0
    age = stamp
    if LFU:
        age = tl.sum(tl.where(holds, uses[None, :], 0), axis=1) * 4294967296 + stamp
    age = tl.where(holder == E, -1, age)
    free = in_s & ~keep
    older = (age[None, :] < age[:, None]) | ((age[None, :] == age[:, None]) & (offs_s[None, :] < offs_s[:, None]))
    rank = tl.sum((free[None, :] & older).to(tl.int32), axis=1)  # [S]: free slots older than slot j
    need_rank = tl.cumsum(need.to(tl.int32), 0) - 1
    match = (need[:, None] & free[None, :]) & (rank[None, :] == need_rank[:, None])  # [E, S]
    target = tl.sum(tl.where(match, offs_s[None, :], 0), axis=1)
    evicted = tl.sum(tl.where(match, holder[None, :], 0), axis=1)
    local = tl.where(hit, slot - base, target)
    useful = tl.sum((tl.sum(tl.where(local[:, None] == offs_s[None, :], fresh[None, :].to(tl.int32), 0), axis=1) > 0)
                    & hit, 0)
    if SCORE:
        predicted = tl.load(Predicted + offs_e, mask=in_e, other=0) != 0
    tl.debug_barrier()
    # ---- stores ----
    tl.store(Slot_of + evicted, tl.full([BLOCK_E], -1, tl.int64), mask=need & (evicted != E))
    tl.debug_barrier()
    tl.store(Slot_of + offs_e, base + target, mask=need)
    tl.store(Holder + target, offs_e.to(tl.int64), mask=need)
    tl.store(Stamp + local, tl.zeros([BLOCK_E], tl.int64) + clock, mask=want)
    tl.store(Copy_dst + offs_e, base + target, mask=in_e)
    tl.store(Copy_valid + offs_e, need, mask=in_e)
    offs_c = tl.arange(0, 8)
    n_need = tl.sum(need.to(tl.int64), 0)
    if PREFETCH:
        tl.store(Fresh + target, tl.full([BLOCK_E], 1, tl.int1), mask=need)
        tl.store(Predicted + offs_e, want, mask=in_e)
        counts += tl.where(offs_c == _PREFETCH_COPIES, n_need, 0)
    else:
        tl.store(Fresh + local, tl.zeros([BLOCK_E], tl.int1), mask=want)
        tl.store(Slot_map + offs_e, tl.where(want, base + local, -1).to(tl.int32), mask=in_e)
        counts += tl.where(offs_c == _HITS, tl.sum(hit.to(tl.int64), 0), 0)
        counts += tl.where(offs_c == _MISSES, n_need, 0)
        counts += tl.where(offs_c == _PREFETCH_USEFUL, useful.to(tl.int64), 0)
        if first_pass:
            tl.store(Order + offs_e, position, mask=in_e)
            tl.store(Uses + offs_e, uses, mask=in_e)
            if FIRST_LAYER:
                tl.store(Clock, clock)
            if SCORE:
                counts += tl.where(offs_c == _PREDICTED, tl.sum(predicted.to(tl.int64), 0), 0)
                counts += tl.where(offs_c == _PREDICTED_USED, tl.sum((predicted & used).to(tl.int64), 0), 0)
                counts += tl.where(offs_c == _USED_WITH_PREDICTION, tl.sum(used.to(tl.int64), 0), 0)
                tl.store(Predicted + offs_e, tl.zeros([BLOCK_E], tl.int1), mask=in_e)
    tl.store(Counts + offs_c, counts)


def place_experts(ids, slot_of, holder, stamp, uses, fresh, predicted, order, clock, counts, slot_map, copy_dst,
                  copy_valid, base: int, pass_index: int, prefetch: bool, lfu: bool, first_layer: bool,
                  score: bool) -> None:
    """Launch `_place_kernel` (one program) on a layer's state rows; see the module docstring."""
    E, S = slot_of.shape[0] - 1, holder.shape[0] - 1
    N = ids.numel()
    _place_kernel[(1,)](
        ids, slot_of, holder, stamp, uses, fresh, predicted, order, clock, counts, slot_map, copy_dst, copy_valid,
        N, E, S, base, pass_index,
        PREFETCH=prefetch, LFU=lfu, FIRST_LAYER=first_layer, SCORE=score,
        BLOCK_E=triton.next_power_of_2(E), BLOCK_S=triton.next_power_of_2(S),
        BLOCK_N=max(16, min(triton.next_power_of_2(N), 8192 // triton.next_power_of_2(E))),
        num_warps=8 if E >= 64 else 4)


def place_experts_ref(ids, slot_of, holder, stamp, uses, fresh, predicted, order, clock, counts, slot_map, copy_dst,
                      copy_valid, base: int, pass_index: int, prefetch: bool, lfu: bool, first_layer: bool,
                      score: bool) -> None:
    """`place_experts` in PyTorch: the same state changes and outputs (ties of age broken by slot index)."""
    E, S = slot_of.shape[0] - 1, holder.shape[0] - 1
    dev = slot_of.device
    e_idx = torch.arange(E, device=dev)
    used = torch.zeros(E, dtype=torch.bool, device=dev).index_fill_(0, ids.reshape(-1), True)
    slot = slot_of[:E].clone()
    resident = slot >= 0
    first_pass = pass_index == 0
    if not prefetch and first_pass:
        uses[:E] += used
        if first_layer:
            clock += 1
        if score:
            pred = predicted[:E].clone()
            counts[COUNTERS.index("predicted")] += pred.sum()
            counts[COUNTERS.index("predicted_used")] += (pred & used).sum()
            counts[COUNTERS.index("used_with_prediction")] += used.sum()
            predicted.zero_()
    hit0, need0 = used & resident, used & ~resident
    position = torch.where(hit0, torch.cumsum(hit0, 0) - 1, hit0.sum() + torch.cumsum(need0, 0) - 1)
    position = torch.where(used, position, E + S)
    if not prefetch:
        if first_pass:
            order.copy_(position)
        else:
            position = order.clone()
    want = used & (position >= pass_index * S) & (position < (pass_index + 1) * S)
    hit, need = want & resident, want & ~resident
    held = holder[:S].clone()
    keep = torch.zeros(E + 1, dtype=torch.bool, device=dev)
    keep[:E] = want
    keep = keep[held]
    age = stamp[:S] + (uses[held] << 32 if lfu else 0)
    age = torch.where(held == E, -1, age)
    free_slots = torch.nonzero(~keep).squeeze(1)
    victims = free_slots[torch.argsort(age[free_slots], stable=True)]  # oldest first, ties by slot index
    needed = e_idx[need]
    target = torch.zeros(E, dtype=torch.int64, device=dev)
    target[needed] = victims[: len(needed)]
    evicted = held[target[needed]]
    slot_of[evicted[evicted != E]] = -1
    slot_of[needed] = base + target[needed]
    holder[target[needed]] = needed
    local = torch.where(hit, slot - base, target)
    stamp[local[want]] = clock
    copy_dst.copy_(base + target)
    copy_valid.copy_(need)
    if prefetch:
        fresh[target[needed]] = True
        predicted[:E] = want
        counts[COUNTERS.index("prefetch_copies")] += need.sum()
    else:
        counts[COUNTERS.index("prefetch_useful")] += (fresh[local] & hit).sum()
        fresh[local[want]] = False
        slot_map.copy_(torch.where(want, base + local, -1).to(torch.int32))
        counts[COUNTERS.index("hits")] += hit.sum()
        counts[COUNTERS.index("misses")] += need.sum()
