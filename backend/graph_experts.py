"""Expert streaming decided on the device, so that a CUDA graph can hold it (issue 35).

`backend/experts.py`'s `ExpertCache` decides on the host: one host synchronisation per MoE layer to
learn the routed experts, then `cudaMemcpyAsync` per missing expert. A graph can hold neither. Here
every decision is taken on the device, with shapes fixed by the step's token count:

- bookkeeping per MoE layer li (rows of device tensors): `slot_of[li, e]` the slot holding expert e or
  -1, `holder[li, j]` the expert in slot j (E: empty), `stamp[li, j]` the step that last used slot j
  (LRU), `uses[li, e]` how often expert e was routed (LFU), and prefetch flags.
- a layer's routed experts (the union of its tokens' top-k) are placed in passes of at most S (the
  layer's slots), resident ones first, by one Triton program per pass (kernels/expert_slots.py): each
  missing expert takes the least recently (or frequently) used slot that the pass does not use, and
  kernels/expert_copy.py copies it from pinned host memory (it reads host memory itself: the rows are
  known only on the device). The fused MoE kernel then runs over the pass's slots; a later pass may
  evict an earlier pass's experts, whose kernels the stream has already ordered before the copy.
- prefetch by pre-gating: after layer li's first placement, layer li+1's router applied to li's input
  names its experts, and they are placed on a side stream that the step forks and layer li+1 joins (a
  graph captures the fork and the join). Layer li+1's slots are not read until then.
- counters stay on the device (no synchronisation); `stats()` reads them.

On the CPU the PyTorch references of the three kernels (placement, copy, MoE pass) run the same steps
synchronously: the tests check the whole bookkeeping there.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from backend.experts import ExpertStore, _LayerExperts, cache_setup
from kernels.expert_copy import copy_rows, copy_rows_ref
from kernels.expert_slots import COUNTERS, place_experts, place_experts_ref
from kernels.fused_moe import reduce_pairs


class DeviceExpertCache:
    """Device slots for `budget_bytes` of experts (`budget // (expert_bytes * layers)` per MoE layer) filled
    from `store`, with every decision taken on the device. `routers[layer](x)`: the layer's router logits (pre-gating);
    `prefetch`: predict the next MoE layer's experts (False: on demand only); `policy` "lru" or "lfu";
    `kernel` "triton" (fused MoE and the copy kernel), "torch" (PyTorch references) or "auto"."""

    graph_safe = True  # StepGraphs captures models served through it

    def __init__(self, store: ExpertStore, routers: dict[int, nn.Module], top_k: int, budget_bytes: int,
                 device, prefetch: bool = True, policy: str = "lru", kernel: str = "auto"):
        self.device, self.kernel, S = cache_setup(store, budget_bytes, device, policy, kernel)
        self.cuda = self.device.type == "cuda"
        L, E = len(store.layers), store.num_experts
        self.store, self.routers, self.top_k, self.policy = store, routers, top_k, policy
        self.prefetch_depth = 1 if prefetch else 0
        self.num_layers, self.num_experts, self.slots_per_layer = L, E, S
        self.budget_bytes = budget_bytes
        self.index = {layer: i for i, layer in enumerate(store.layers)}
        dev = self.device
        self.w13 = torch.empty(L * S, 2 * store.inter, store.hidden, dtype=store.dtype, device=dev)
        self.w2 = torch.empty(L * S, store.hidden, store.inter, dtype=store.dtype, device=dev)
        self.slot_of = torch.full((L, E + 1), -1, dtype=torch.int64, device=dev)
        self.holder = torch.full((L, S + 1), E, dtype=torch.int64, device=dev)
        self.stamp = torch.full((L, S + 1), -1, dtype=torch.int64, device=dev)
        self.uses = torch.zeros(L, E + 1, dtype=torch.int64, device=dev)
        self.fresh = torch.zeros(L, S + 1, dtype=torch.bool, device=dev)  # prefetched, not used since
        self.predicted_mask = torch.zeros(L, E + 1, dtype=torch.bool, device=dev)
        self.order = torch.zeros(E, dtype=torch.int64, device=dev)  # a layer's order of passes (scratch)
        self.clock = torch.zeros((), dtype=torch.int64, device=dev)
        self.expert_ids = torch.arange(E, device=dev)  # the copies' source rows
        # per stream: counters and the placement's outputs (slot map, copy destinations, which to copy)
        self.counts = torch.zeros(len(COUNTERS), dtype=torch.int64, device=dev)
        self.prefetch_counts = torch.zeros(len(COUNTERS), dtype=torch.int64, device=dev)
        self.run_out, self.prefetch_out = (
            (torch.zeros(E, dtype=torch.int32, device=dev), torch.zeros(E, dtype=torch.int64, device=dev),
             torch.zeros(E, dtype=torch.bool, device=dev)) for _ in range(2))
        self.copy_stream = torch.cuda.Stream(dev) if self.cuda else None
        self.joins: list = [None] * L  # per layer: the event of a prefetch issued for it in this forward
        self.predicted: list[bool] = [False] * L  # per layer: a prediction was made for it in this forward

    def layer(self, layer: int) -> _LayerExperts:
        return _LayerExperts(self, layer)

    @property
    def nbytes(self) -> int:
        return self.w13.nbytes + self.w2.nbytes

    # ---- placement ----------------------------------------------------------------------
    def _place(self, li: int, ids: torch.Tensor, pass_index: int, prefetch: bool):
        """Place the experts of `ids` (this pass's share of them) in layer li's slots (kernels/expert_slots.py)
        and copy in the missing ones; a run's `slot_map` then maps the pass's experts to their slots."""
        out = self.prefetch_out if prefetch else self.run_out
        place = place_experts if self.kernel == "triton" else place_experts_ref
        place(ids.reshape(-1), self.slot_of[li], self.holder[li], self.stamp[li], self.uses[li], self.fresh[li],
              self.predicted_mask[li], self.order, self.clock, self.prefetch_counts if prefetch else self.counts,
              *out, base=li * self.slots_per_layer, pass_index=pass_index, prefetch=prefetch,
              lfu=self.policy == "lfu", first_layer=li == 0 and not prefetch,
              score=self.predicted[li] and pass_index == 0 and not prefetch)
        copy = copy_rows if self.kernel == "triton" else copy_rows_ref
        layer = self.store.layers[li]
        _, copy_dst, copy_valid = out
        copy(self.store.w13[layer], self.w13, self.expert_ids, copy_dst, copy_valid)
        copy(self.store.w2[layer], self.w2, self.expert_ids, copy_dst, copy_valid)

    # ---- prediction ---------------------------------------------------------------------
    def _prefetch(self, li: int, x: torch.Tensor):
        """Pre-gating: place layer li's likely experts (its router's top k for `x`), on the side stream."""
        ids = torch.topk(self.routers[self.store.layers[li]](x), self.top_k, dim=-1).indices
        self.predicted[li] = True
        if not self.cuda:
            self._place(li, ids, 0, prefetch=True)
            return
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        ids.record_stream(self.copy_stream)
        with torch.cuda.stream(self.copy_stream):
            self._place(li, ids, 0, prefetch=True)
            self.joins[li] = torch.cuda.Event()
            self.joins[li].record(self.copy_stream)

    # ---- compute ------------------------------------------------------------------------
    @torch.no_grad()
    def run(self, layer: int, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The routed experts' output [T, H] of MoE layer `layer` for x [T, H], weights/ids [T, k]: passes of at
        most S experts (the union has at most min(T * k, E)), the next layer's prefetch forked after the first."""
        li = self.index[layer]
        T, k = ids.shape
        if li == 0:
            self.counts[COUNTERS.index("tokens")] += T
        if self.joins[li] is not None:  # this layer's prefetch, forked while the previous layer ran
            torch.cuda.current_stream(self.device).wait_event(self.joins[li])
            self.joins[li] = None
        pairs = torch.empty(T * k, x.shape[1], dtype=x.dtype, device=x.device)  # every pair's expert is in a pass
        scratch = self._pass_scratch(x, weights, ids)
        for p in range(-(-min(T * k, self.num_experts) // self.slots_per_layer)):
            self._place(li, ids, p, prefetch=False)
            if p == 0:
                self.predicted[li] = False
                if li + 1 < self.num_layers and self.prefetch_depth:
                    self._prefetch(li + 1, x)
            self._pass(x, weights, ids, self.run_out[0], pairs, scratch)
        return reduce_pairs(pairs, k, x.dtype)

    def _pass_scratch(self, x, weights, ids):
        """What every pass of a layer shares (the fused kernel's pairs sorted by expert, its activations), or None
        for the PyTorch path."""
        if self.kernel != "triton":
            return None
        from kernels.fused_moe import block_size_m, moe_align_block_size
        T, k = ids.shape
        align = moe_align_block_size(ids, block_size_m(T * k, self.num_experts), self.num_experts)
        act = torch.empty(T * k, self.store.inter, dtype=x.dtype, device=x.device)
        return weights.contiguous(), align, act

    def _pass(self, x, weights, ids, slot_map, pairs, scratch):
        """pairs[p] = weight * expert(x[token]) for the pairs whose expert has a slot in `slot_map`."""
        if scratch is not None:
            from kernels.fused_moe import fused_moe_pass
            weights, align, act = scratch
            fused_moe_pass(x, self.w13, self.w2, weights, align, slot_map, act, pairs)
            return
        k, inter = ids.shape[1], self.store.inter
        flat, slots = ids.reshape(-1), slot_map.tolist()  # the CPU reference may synchronise
        for e in flat.unique().tolist():
            if slots[e] < 0:
                continue
            rows = (flat == e).nonzero().squeeze(1)
            xe, w13 = x[rows // k], self.w13[slots[e]]
            y = (F.silu(xe @ w13[:inter].T) * (xe @ w13[inter:].T)) @ self.w2[slots[e]].T
            pairs[rows] = y * weights.reshape(-1)[rows, None]

    # ---- metrics ------------------------------------------------------------------------
    def synchronize(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def reset_stats(self):
        self.synchronize()
        self.counts.zero_()
        self.prefetch_counts.zero_()

    def resident_experts(self, layer: int) -> list[int]:
        """The experts layer `layer` holds now (tests; synchronises)."""
        held = self.holder[self.index[layer], :self.slots_per_layer].tolist()
        return sorted(e for e in held if e != self.num_experts)

    def stats(self) -> dict:
        """The counters of `ExpertCache.stats`, names prefixed `expert_` (one synchronisation). Copies run
        inside the step's kernels, so no stall or copy time is timed here: benchmarks time whole steps."""
        raw = dict(zip(COUNTERS, (self.counts + self.prefetch_counts).tolist()))
        uses = raw["hits"] + raw["misses"]
        eb = self.store.expert_bytes
        raw["bytes_on_demand"], raw["bytes_prefetched"] = raw["misses"] * eb, raw["prefetch_copies"] * eb
        streamed = raw["bytes_on_demand"] + raw["bytes_prefetched"]
        out = {f"expert_{k}": v for k, v in raw.items()}
        out.update({
            "expert_policy": self.policy, "expert_prefetch": self.prefetch_depth, "expert_decisions": "device",
            "expert_slots_per_layer": self.slots_per_layer, "expert_num_experts": self.num_experts,
            "expert_cache_bytes": self.nbytes, "expert_store_bytes": self.store.nbytes,
            "expert_hit_rate": raw["hits"] / uses if uses else 1.0,
            "expert_prefetch_precision": raw["predicted_used"] / raw["predicted"] if raw["predicted"] else 0.0,
            "expert_prefetch_recall": (raw["predicted_used"] / raw["used_with_prediction"]
                                       if raw["used_with_prediction"] else 0.0),
            "expert_bytes_streamed": streamed,
            "expert_bytes_per_token": streamed / max(raw["tokens"], 1),
        })
        return out
