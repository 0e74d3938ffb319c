"""Expert streaming: serve MoE models whose experts do not all fit in device memory.

- `ExpertStore`: every routed expert's weights in host memory (pinned when the device is CUDA),
  per MoE layer `w13 [E, 2I, H]` (gate rows, then up rows) and `w2 [E, H, I]`.
- `ExpertCache`: one per model. A device slot pool sized from a byte budget, split evenly over
  the MoE layers (per-layer slots), a slot table [layer, expert] -> slot or -1, an eviction policy
  (LRU, or LFU), on-demand fetches of the experts a step uses, and prefetch by pre-gating: while
  layer L runs, the routers of layers L+1.. (further ahead only while the link has room) are
  applied to the hidden state entering L's MoE, and the experts they pick are copied ahead.
- `attach_expert_streaming(model, budget_bytes, ...)`: a module-swap pass (model.py only knows
  the `MoE.experts` hook): moves the stacked expert weights out of the MoE modules into the
  store, and sets each `MoE.experts` to the cache's view of that layer.

Same bookkeeping on every device. On CUDA the copies run on a dedicated copy stream: a slot's
copy waits for the event of the last kernel that read the slot (no overwrite under a reader),
and the compute stream waits for the copy event of every slot it reads (no read before the
write); an expert missing at use time is fetched on demand, ahead of any prefetch. On the CPU
both sides are CPU tensors and copies are synchronous.

Compute: on CUDA the fused Triton kernel (kernels/fused_moe.py) reads the experts through the
slot table, one launch per projection; when a step needs more experts than a layer has slots,
it runs in passes over the slots, refilled between passes. On the CPU, `kernels.moe_reference.
grouped_experts` runs on the slots, fetching each expert just before its matmuls: the same
arithmetic as the resident model, so outputs are bit-identical.

One host synchronisation per MoE layer and step (the routed expert ids and the prefetch
predictions come back together), except with every expert resident (budget >= all experts),
where the slot table is fixed and nothing is synchronised.
"""
from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from backend.model import MoE
from kernels.moe_reference import grouped_experts

POLICIES = ("lru", "lfu")


def expert_nbytes(hidden: int, inter: int, dtype: torch.dtype) -> int:
    """Bytes of one routed expert (gate, up and down projections)."""
    return 3 * hidden * inter * torch.empty((), dtype=dtype).element_size()


def _host_empty(shape, dtype, pin: bool) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, pin_memory=pin)


class ExpertStore:
    """Every MoE layer's experts in host memory: `w13[layer] [E, 2I, H]`, `w2[layer] [E, H, I]`."""

    def __init__(self, w13: dict[int, torch.Tensor], w2: dict[int, torch.Tensor]):
        self.layers = sorted(w13)
        first = w13[self.layers[0]]
        self.num_experts, two_i, self.hidden = first.shape
        self.inter = two_i // 2
        self.dtype = first.dtype
        self.w13, self.w2 = w13, w2
        self.expert_bytes = expert_nbytes(self.hidden, self.inter, self.dtype)

    @property
    def nbytes(self) -> int:
        return self.expert_bytes * self.num_experts * len(self.layers)

    @classmethod
    def take_from(cls, moes: dict[int, MoE], dtype: torch.dtype, pin: bool) -> "ExpertStore":
        """Move the stacked weights out of `moes` (their parameters are deleted) into the store."""
        w13, w2 = {}, {}
        for i, moe in moes.items():
            w13[i] = _host_empty(moe.w13.shape, dtype, pin)
            w13[i].copy_(moe.w13.detach())
            w2[i] = _host_empty(moe.w2.shape, dtype, pin)
            w2[i].copy_(moe.w2.detach())
            del moe.w13, moe.w2
        return cls(w13, w2)

    @classmethod
    def dummy(cls, layers, num_experts: int, hidden: int, inter: int, dtype: torch.dtype, pin: bool,
              seed: int = 0, device="cpu") -> "ExpertStore":
        """Random experts ~U(-1, 1)/sqrt(fan_in) (as the loader's dummy format), drawn on `device`
        one layer at a time and copied to the host (benchmarks of checkpoints we do not have)."""
        g = torch.Generator(device=device).manual_seed(seed)
        w13, w2 = {}, {}
        for i in layers:
            a = torch.empty(num_experts, 2 * inter, hidden, dtype=dtype, device=device)
            w13[i] = _host_empty(a.shape, dtype, pin)
            w13[i].copy_(a.uniform_(-1, 1, generator=g).mul_(hidden ** -0.5))
            del a
            b = torch.empty(num_experts, hidden, inter, dtype=dtype, device=device)
            w2[i] = _host_empty(b.shape, dtype, pin)
            w2[i].copy_(b.uniform_(-1, 1, generator=g).mul_(inter ** -0.5))
            del b
        return cls(w13, w2)


def cache_setup(store: ExpertStore, budget_bytes: int | None, device, policy: str,
                kernel: str) -> tuple[torch.device, str, int]:
    """An expert cache's (device, kernel, slots per MoE layer), its options checked: `budget_bytes`
    split evenly over the layers (None: every expert), `kernel` "auto" -> "triton" on CUDA."""
    if policy not in POLICIES:
        raise ValueError(f"expert cache policy must be one of {POLICIES}, not {policy!r}")
    device = torch.device(device)
    resolved = ("triton" if device.type == "cuda" else "torch") if kernel == "auto" else kernel
    if resolved not in ("triton", "torch"):
        raise ValueError(f"expert kernel must be 'triton', 'torch' or 'auto', not {kernel!r}")
    L, E = len(store.layers), store.num_experts
    per_layer = E if budget_bytes is None else budget_bytes // (store.expert_bytes * L)
    if per_layer < 1:
        raise ValueError(f"expert budget of {budget_bytes} bytes holds less than one expert per MoE "
                         f"layer; the least is {store.expert_bytes * L} bytes ({L} layers x "
                         f"{store.expert_bytes} bytes)")
    return device, resolved, min(E, per_layer)


@dataclass
class ExpertStats:
    tokens: int = 0  # tokens through the first MoE layer
    hits: int = 0  # (layer, step, expert) uses found resident, or already on its way by a prefetch
    misses: int = 0  # ... fetched on demand at use time
    evictions: int = 0
    predicted: int = 0  # experts predicted for a layer (the last prediction before it ran)
    predicted_used: int = 0  # ... of them used
    used_with_prediction: int = 0  # experts used by layers that had a prediction
    prefetch_copies: int = 0
    prefetch_useful: int = 0  # prefetched experts used before being evicted
    bytes_on_demand: int = 0
    bytes_prefetched: int = 0
    stall_s: float = 0.0  # compute waiting for copies (CUDA: measured with events on the stream)
    copy_s: float = 0.0  # time the copies took, summed over copy batches
    copy_bytes_timed: int = 0


class _LayerExperts:
    """`MoE.experts` of one layer: `run(x, weights, ids)` computes the routed experts' output."""

    def __init__(self, cache: "ExpertCache", layer: int):
        self.cache, self.layer = cache, layer

    def run(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.cache.run(self.layer, x, weights, ids)


class ExpertCache:
    """Device slots for `budget_bytes` of experts (None: all of them), `budget // (expert_bytes *
    layers)` per MoE layer, filled from `store`. `routers[layer](x)` gives the layer's router logits (pre-gating),
    `prefetch` how many MoE layers ahead to predict (0: fetch on demand only), `policy` "lru" or
    "lfu", `kernel` "triton" (fused MoE), "torch" (grouped_experts) or "auto" (triton on CUDA)."""

    def __init__(self, store: ExpertStore, routers: dict[int, nn.Module], top_k: int,
                 budget_bytes: int | None, device, prefetch: int = 1, policy: str = "lru",
                 kernel: str = "auto"):
        self.device, self.kernel, S = cache_setup(store, budget_bytes, device, policy, kernel)
        self.cuda = self.device.type == "cuda"
        self.store, self.routers, self.top_k = store, routers, top_k
        self.policy, self.prefetch_depth = policy, max(0, int(prefetch))
        L, E = len(store.layers), store.num_experts
        self.num_layers, self.num_experts = L, E
        self.slots_per_layer = S
        self.budget_bytes = budget_bytes
        self.index = {layer: i for i, layer in enumerate(store.layers)}
        self.w13 = torch.empty(L * S, 2 * store.inter, store.hidden, dtype=store.dtype, device=self.device)
        self.w2 = torch.empty(L * S, store.hidden, store.inter, dtype=store.dtype, device=self.device)
        # bookkeeping, per layer index li; slots are global rows of the pools, li * S + j
        self.slot_table = torch.full((L, E), -1, dtype=torch.int32)  # host mirror of the residency
        self.resident = [OrderedDict() for _ in range(L)]  # expert -> slot, least recently used first
        self.free = [list(range((li + 1) * S - 1, li * S - 1, -1)) for li in range(L)]
        self.freq = [[0] * E for _ in range(L)]
        self.prefetched = [set() for _ in range(L)]  # brought in by prefetch, unused since
        self.predicted: list[set | None] = [None] * L
        self.ready: list = [None] * (L * S)  # CUDA event: the slot's copy is done
        self.in_use: list = [None] * (L * S)  # CUDA event: the last kernel reading the slot is done
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.room_bytes = store.expert_bytes * top_k  # deeper prefetch only below this much in flight
        self.counters = ExpertStats()
        self._timings: deque = deque()  # (start, end, bytes) copy batches not yet read
        self._stalls: deque = deque()
        self._inflight = 0
        self.static = S == E  # every expert resident: fixed slot table, no host sync
        if self.static:
            for li in range(L):
                self.acquire(li, list(range(E)), prefetch=True)
            self.synchronize()
            self.ready = [None] * (L * S)
            self.prefetched = [set() for _ in range(L)]
            self.counters = ExpertStats()
            self._static_maps = [torch.arange(li * E, (li + 1) * E, dtype=torch.int32, device=self.device)
                                 for li in range(L)]
            self._static_used = torch.zeros((), dtype=torch.int64, device=self.device)

    # ---- bookkeeping --------------------------------------------------------------------
    def layer(self, layer: int) -> _LayerExperts:
        return _LayerExperts(self, layer)

    @property
    def nbytes(self) -> int:
        return self.w13.nbytes + self.w2.nbytes

    def _victim(self, li: int, hard: set, soft: set) -> int:
        """The resident expert to evict: never one in `hard`, one outside `soft` if possible."""
        res = self.resident[li]
        for avoid in (hard | soft, hard):
            cands = [e for e in res if e not in avoid]  # least recently used first
            if cands:
                if self.policy == "lfu":
                    freq = self.freq[li]
                    return min(cands, key=lambda e: freq[e])  # min is stable: LRU among equals
                return cands[0]
        raise RuntimeError("no expert slot can be freed")  # callers never pin more than S experts

    def acquire(self, li: int, experts, soft=(), prefetch: bool = False) -> list[int]:
        """Slots holding `experts` (at most S) of the li-th MoE layer, copying in the missing ones;
        evictions spare `experts` and, when they can, `soft` (experts needed later in this step).
        Hits touch the policy's recency; counting hits and misses is the caller's (`run`)."""
        res, slots, missing = self.resident[li], [], []
        hard = set(experts)
        for e in experts:
            if e in res:
                res.move_to_end(e)
            else:
                if self.free[li]:
                    s = self.free[li].pop()
                else:
                    victim = self._victim(li, hard, set(soft))
                    s = res.pop(victim)
                    self.slot_table[li, victim] = -1
                    self.prefetched[li].discard(victim)
                    self.counters.evictions += 1
                res[e] = s
                self.slot_table[li, e] = s
                missing.append((e, s))
            slots.append(res[e])
        if missing:
            self._copy_in(li, missing, prefetch)
        return slots

    def _copy_in(self, li: int, items: list[tuple[int, int]], prefetch: bool):
        layer = self.store.layers[li]
        src13, src2 = self.store.w13[layer], self.store.w2[layer]
        nbytes = len(items) * self.store.expert_bytes
        st = self.counters
        if prefetch:
            st.bytes_prefetched += nbytes
            st.prefetch_copies += len(items)
            self.prefetched[li].update(e for e, _ in items)
        else:
            st.bytes_on_demand += nbytes
        if self.cuda:
            stream = self.copy_stream
            for _, s in items:  # never overwrite a slot a queued kernel still reads
                if self.in_use[s] is not None:
                    stream.wait_event(self.in_use[s])
                    self.in_use[s] = None
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                start.record()
                for e, s in items:
                    self.w13[s].copy_(src13[e], non_blocking=True)
                    self.w2[s].copy_(src2[e], non_blocking=True)
                end.record()
            for _, s in items:
                self.ready[s] = end
            self._timings.append((start, end, nbytes))
            self._inflight += nbytes
        else:
            t = time.perf_counter()
            for e, s in items:
                self.w13[s].copy_(src13[e])
                self.w2[s].copy_(src2[e])
            dt = time.perf_counter() - t
            st.copy_s += dt
            st.copy_bytes_timed += nbytes
            if not prefetch:
                st.stall_s += dt

    def _wait(self, slots):
        """The compute stream waits for the copies into `slots` (CUDA); stalls are timed by events."""
        if not self.cuda:
            return
        pending = []
        for s in slots:
            ev = self.ready[s]
            if ev is not None:
                if not ev.query():
                    pending.append(ev)
                self.ready[s] = None  # later kernels on this stream are ordered after the wait
        if pending:
            stream = torch.cuda.current_stream(self.device)
            s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s0.record(stream)
            for ev in dict.fromkeys(pending):
                stream.wait_event(ev)
            s1.record(stream)
            self._stalls.append((s0, s1))

    def _mark_in_use(self, slots):
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            for s in slots:
                self.in_use[s] = ev

    def _poll(self):
        """Read the timing events that have completed (never blocks)."""
        st = self.counters
        while self._timings and self._timings[0][1].query():
            start, end, nbytes = self._timings.popleft()
            st.copy_s += start.elapsed_time(end) / 1e3
            st.copy_bytes_timed += nbytes
            self._inflight -= nbytes
        while self._stalls and self._stalls[0][1].query():
            s0, s1 = self._stalls.popleft()
            st.stall_s += s0.elapsed_time(s1) / 1e3

    # ---- prediction ---------------------------------------------------------------------
    def _ahead(self, li: int) -> list[int]:
        """Layers to predict from layer li: the next one, further ones while the link has room."""
        out = []
        for j in range(1, self.prefetch_depth + 1):
            if li + j >= self.num_layers or (j > 1 and self._inflight > self.room_bytes):
                break
            out.append(li + j)
        return out

    def router_mass(self, li: int, x: torch.Tensor) -> torch.Tensor:
        """Pre-gating: layer li's router applied to `x`; [E] top-k routing mass summed over tokens."""
        probs = F.softmax(self.routers[self.store.layers[li]](x), dim=-1, dtype=torch.float32)
        w, ids = torch.topk(probs, self.top_k, dim=-1)
        return torch.zeros(self.num_experts, dtype=torch.float32, device=x.device).scatter_add_(
            0, ids.reshape(-1), w.reshape(-1))

    def prefetch(self, li: int, mass: list[float]):
        """Copy in layer li's most likely experts (by predicted mass, at most its slots)."""
        ranked = sorted((e for e in range(self.num_experts) if mass[e] > 0), key=lambda e: -mass[e])
        ranked = ranked[: self.slots_per_layer]
        self.predicted[li] = set(ranked)
        self.acquire(li, ranked, prefetch=True)

    def _score(self, li: int, used: list[int]):
        st = self.counters
        pred = self.predicted[li]
        if pred is not None:
            st.predicted += len(pred)
            st.predicted_used += len(pred.intersection(used))
            st.used_with_prediction += len(used)
            self.predicted[li] = None
        res, pre, freq = self.resident[li], self.prefetched[li], self.freq[li]
        for e in used:
            freq[e] += 1
            if e in res:
                st.hits += 1
                if e in pre:
                    st.prefetch_useful += 1
                    pre.discard(e)
            else:
                st.misses += 1

    # ---- compute ------------------------------------------------------------------------
    @torch.no_grad()
    def run(self, layer: int, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The routed experts' output [T, H] of MoE layer `layer` for x [T, H], weights/ids [T, k]."""
        li = self.index[layer]
        if li == 0:
            self.counters.tokens += x.shape[0]
        if self.cuda:
            self._poll()
        if self.static:
            return self._run_static(li, x, weights, ids)
        # one host sync: the experts this layer uses and the predictions for the layers ahead
        ahead = self._ahead(li)
        masses = [self.router_mass(l2, x) for l2 in ahead]
        host = torch.cat([ids.reshape(-1).float(), *masses]).tolist()
        n, E = ids.numel(), self.num_experts
        used = sorted({int(v) for v in host[:n]})
        predictions = [(l2, host[n + j * E: n + (j + 1) * E]) for j, l2 in enumerate(ahead)]
        self._score(li, used)
        if self.kernel == "torch":
            return self._run_torch(li, x, weights, ids, used, predictions)
        return self._run_triton(li, x, weights, ids, used, predictions)

    def _run_static(self, li, x, weights, ids):
        E = self.num_experts
        self._static_used += torch.bincount(ids.reshape(-1), minlength=E).gt(0).sum()
        if self.kernel == "torch":
            S = li * E
            return grouped_experts(x, weights, ids, E, lambda e: self._views(S + e))
        from kernels.fused_moe import fused_moe
        return fused_moe(x, self.w13, self.w2, weights.contiguous(), ids, self._static_maps[li])

    def _views(self, s: int):
        inter = self.store.inter
        return self.w13[s, :inter], self.w13[s, inter:], self.w2[s]

    def _run_torch(self, li, x, weights, ids, used, predictions):
        """grouped_experts over the slots, each expert fetched just before its matmuls."""
        for l2, mass in predictions:  # prefetch first: on the CPU copies are synchronous anyway
            self.prefetch(l2, mass)
        later = set(used)
        last = []

        def expert_weights(e):
            self._mark_in_use(last)  # the previous expert's matmuls are queued: its slot may go
            later.discard(e)
            s = self.acquire(li, [e], soft=later)[0]
            self._wait([s])
            last[:] = [s]
            return self._views(s)

        out = grouped_experts(x, weights, ids, self.num_experts, expert_weights)
        self._mark_in_use(last)
        return out

    def _run_triton(self, li, x, weights, ids, used, predictions):
        """The fused kernel over the slots; in passes of at most S experts when the step needs more."""
        from kernels.fused_moe import block_size_m, fused_moe_pass, moe_align_block_size, reduce_pairs
        T, H = x.shape
        k, E, S = ids.shape[1], self.num_experts, self.slots_per_layer
        res = self.resident[li]
        order = [e for e in used if e in res] + [e for e in used if e not in res]  # hits first
        align = moe_align_block_size(ids, block_size_m(T * k, E), E)
        act = torch.empty(T * k, self.store.inter, dtype=x.dtype, device=x.device)
        pairs = torch.empty(T * k, H, dtype=x.dtype, device=x.device)
        weights = weights.contiguous()
        for p in range(0, len(order), S):
            chunk = order[p:p + S]
            slots = self.acquire(li, chunk, soft=order[p + S:])
            if p == 0:  # prefetches queue behind this layer's own misses on the copy stream
                for l2, mass in predictions:
                    self.prefetch(l2, mass)
            self._wait(slots)
            slot_map = [-1] * E
            for e, s in zip(chunk, slots):
                slot_map[e] = s
            slot_map = torch.tensor(slot_map, dtype=torch.int32).to(x.device, non_blocking=True)
            fused_moe_pass(x, self.w13, self.w2, weights, align, slot_map, act, pairs)
            self._mark_in_use(slots)
        return reduce_pairs(pairs, k, x.dtype)

    # ---- metrics ------------------------------------------------------------------------
    def synchronize(self):
        """Wait for every copy and kernel, then read all timing events (benchmarks)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self._poll()

    def reset_stats(self):
        self.synchronize()
        self.counters = ExpertStats()
        if self.static:
            self._static_used.zero_()

    def stats(self) -> dict:
        """Counters and rates, names prefixed `expert_` (exported with the engine's metrics)."""
        if self.cuda:
            self._poll()
        st = self.counters
        raw = {f.name: getattr(st, f.name) for f in fields(st)}
        if self.static:
            raw["hits"] += int(self._static_used.item())
        uses = raw["hits"] + raw["misses"]
        streamed = raw["bytes_on_demand"] + raw["bytes_prefetched"]
        tokens = max(raw["tokens"], 1)
        out = {f"expert_{k}": v for k, v in raw.items()}
        out.update({
            "expert_policy": self.policy,
            "expert_prefetch": self.prefetch_depth,
            "expert_slots_per_layer": self.slots_per_layer,
            "expert_num_experts": self.num_experts,
            "expert_cache_bytes": self.nbytes,
            "expert_store_bytes": self.store.nbytes,
            "expert_hit_rate": raw["hits"] / uses if uses else 1.0,
            "expert_prefetch_precision": raw["predicted_used"] / raw["predicted"] if raw["predicted"] else 0.0,
            "expert_prefetch_recall": (raw["predicted_used"] / raw["used_with_prediction"]
                                       if raw["used_with_prediction"] else 0.0),
            "expert_bytes_streamed": streamed,
            "expert_bytes_per_token": streamed / tokens,
            "expert_stall_s_per_token": raw["stall_s"] / tokens,
            "expert_copy_gbps": raw["copy_bytes_timed"] / raw["copy_s"] / 1e9 if raw["copy_s"] > 0 else 0.0,
        })
        return out


def attach_expert_streaming(model: nn.Module, budget_bytes: int | None, prefetch: int = 1,
                            policy: str = "lru", device=None, dtype: torch.dtype | None = None,
                            kernel: str = "auto", decisions: str = "host"):
    """Move `model`'s routed experts into an `ExpertStore` (pinned host memory when `device` is
    CUDA) and serve them through a cache of `budget_bytes` on `device` (default: the routers'
    device): an `ExpertCache` (`decisions` "host") or a `DeviceExpertCache` ("device",
    backend/graph_experts.py: CUDA graphs can hold it). Sets every `MoE.experts` hook and
    `model.expert_cache`. The stacked expert parameters are deleted from the MoE modules, so a
    later `model.to(device)` leaves them out."""
    if decisions not in ("host", "device"):
        raise ValueError(f"expert decisions must be 'host' or 'device', not {decisions!r}")
    if decisions == "device" and budget_bytes is None:
        raise ValueError("the device expert cache needs a budget (without one every expert is resident)")
    moes = {i: layer.mlp for i, layer in enumerate(model.layers) if isinstance(layer.mlp, MoE)}
    if not moes:
        raise ValueError("expert streaming needs a mixture-of-experts model")
    first = next(iter(moes.values()))
    device = torch.device(device if device is not None else first.gate.weight.device)
    dtype = dtype or first.w13.dtype
    store = ExpertStore.take_from(moes, dtype, pin=device.type == "cuda")
    routers = {i: m.prefetch_logits for i, m in moes.items()}  # pre-gating
    if decisions == "device":
        from backend.graph_experts import DeviceExpertCache
        cache = DeviceExpertCache(store, routers, first.top_k, budget_bytes, device, prefetch > 0, policy, kernel)
    else:
        cache = ExpertCache(store, routers, first.top_k, budget_bytes, device, prefetch, policy, kernel)
    for i, m in moes.items():
        m.experts = cache.layer(i)
    model.expert_cache = cache
    return cache
