"""Routing statistics of a served MoE on real text, and what they mean for an expert cache.

    python -m benchmarks.moe_routing [--model smollm2-moe] [--tokens 4096] [--out DIR]

Runs the model over WikiText-2 test text (teacher-forced, windows of 2,048 tokens, through the engine), records
each MoE layer's chosen experts per token, and reports per layer:
- load: the share of routed slots each expert takes (max / mean, and the normalised entropy; 1 = uniform);
- reuse: the share of a token's experts that the previous token also chose (uniform routing: k / E);
- predictability: how many of layer L's experts the k experts most often chosen at L given layer L-1's choice
  name (a co-occurrence table fitted on the first half of the tokens, scored on the second half);
- an LRU cache of 25% and 50% of each layer's experts (the shared expert stays resident), tokens one at a time
  as batch-1 decode: its hit rate,
  against the same cache under uniform random routing with the same k (seeded);
- hit rate against cache size (25% to 75%) for LRU, LFU and Belady's offline optimum (the bound any policy
  meets), on this router, on uniform routing and on `moe_routing="local"`'s tables (backend/model.py
  `local_routes` with the engine's LOCALITY), whose statistics come from this router.
Writes routing.json and routing.png to --out.
"""
from __future__ import annotations

import argparse
import json
import math
import os

import numpy as np
import torch

from backend.engine import LOCALITY, EngineArgs, LLMEngine
from backend.evaluate import DEFAULT_TEXT
from backend.model import MoE, local_routes


def record_routing(model: str, tokens: int) -> tuple[torch.Tensor, int]:
    """Chosen experts [layers, tokens, k] and the number of experts per layer."""
    eng = LLMEngine(EngineArgs(model=model, kv_format="full", max_num_seqs=1, max_model_len=2048,
                               kv_budget_bytes=1 << 30))
    moes = [m for m in eng.model.modules() if isinstance(m, MoE)]
    chosen = [[] for _ in moes]
    originals = [m.route for m in moes]
    for i, m in enumerate(moes):
        def route(x, i=i, original=originals[i]):
            weights, ids = original(x)
            chosen[i].append(ids.clone())
            return weights, ids
        m.route = route
    with open(DEFAULT_TEXT, encoding="utf-8") as f:
        ids = eng.tokenizer.encode(f.read(), add_special_tokens=False)[:tokens]
    for start in range(0, len(ids), 2048):
        eng.score(ids[start:start + 2048], chunk_size=2048)
    return torch.stack([torch.cat(c) for c in chosen]), moes[0].gate.out_features


def cache_hit_rate(ids: torch.Tensor, slots: int, policy: str) -> float:
    """ids [T, k] of one layer, tokens in order: the share of a token's experts already cached when its step
    starts, for a cache of `slots` (>= k) experts that then holds all k. Evicts the least recently used
    (`lru`), the least often used so far (`lfu`, ties: least recent) or the one needed again latest (`belady`);
    among one token's experts, the earlier in its row counts as the older (an LRU list's insertion order)."""
    rows = ids.numpy()
    T, k = rows.shape
    E = int(rows.max()) + 1
    next_use = np.full((T, k), T)  # the next token after t that uses row t's expert j
    upcoming = np.full(E, T)
    for t in range(T - 1, -1, -1):
        next_use[t] = upcoming[rows[t]]
        upcoming[rows[t]] = t
    cached = np.zeros(E, dtype=bool)
    uses = np.zeros(E, dtype=np.int64)
    priority = np.zeros(E)  # smallest goes first
    order = np.arange(k)
    hits = 0
    for t in range(T):
        row = rows[t]
        hits += int(cached[row].sum())
        uses[row] += 1
        recency = t * k + order  # exact in float64: T * k < 2**53
        priority[row] = {"lru": recency, "lfu": uses[row] * T * k + recency,
                         "belady": -next_use[t] * T * k + recency}[policy]
        cached[row] = True
        excess = int(cached.sum()) - slots
        if excess > 0:
            candidates = np.flatnonzero(cached)
            candidates = candidates[~np.isin(candidates, row)]
            cached[candidates[np.argsort(priority[candidates], kind="stable")[:excess]]] = False
    return hits / rows.size


CACHE_FRACTIONS = (0.25, 0.375, 0.5, 0.75)
POLICIES = ("lru", "lfu", "belady")


def layer_stats(ids: torch.Tensor, prev: torch.Tensor | None, E: int) -> dict:
    T, k = ids.shape
    load = torch.bincount(ids.flatten(), minlength=E).float() / ids.numel()
    entropy = -(load[load > 0] * load[load > 0].log()).sum().item() / math.log(E)
    onehot = torch.zeros(T, E).scatter_(1, ids, 1.0)
    reuse = (onehot[1:] * onehot[:-1]).sum(1).mean().item() / k
    out = {"load_max_over_mean": (load.max() * E).item(), "load_entropy": entropy, "reuse": reuse}
    if prev is not None:  # layer L's experts predicted from layer L-1's, table fitted on the first half
        half = T // 2
        before = torch.zeros(T, E).scatter_(1, prev, 1.0)
        table = before[:half].T @ onehot[:half]              # [E_prev, E]: co-occurrence counts
        guess = (before[half:] @ table).topk(k, dim=1).indices
        hit = torch.zeros(T - half, E).scatter_(1, guess, 1.0) * onehot[half:]
        out["predicted_from_previous_layer"] = hit.sum(1).mean().item() / k
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-moe")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--out", default="reports/moe_routing")
    a = p.parse_args(argv)
    chosen, E = record_routing(a.model, a.tokens)
    L, T, k = chosen.shape
    uniform = torch.stack([torch.rand(T, E, generator=torch.Generator().manual_seed(i)).topk(k, 1).indices
                           for i in range(L)])
    local = torch.stack([local_routes(E, k, T, *LOCALITY, seed=i) for i in range(L)])
    hits = {source: {p: {f: [cache_hit_rate(ids[i], int(E * f), p) for i in range(L)] for f in CACHE_FRACTIONS}
                     for p in POLICIES}
            for source, ids in (("router", chosen), ("uniform", uniform), ("local", local))}  # per layer
    layers = [layer_stats(chosen[i], chosen[i - 1] if i else None, E) for i in range(L)]
    fractions = (0.25, 0.5)
    for i, s in enumerate(layers):
        for f in fractions:
            s[f"lru_hit_{f}"] = hits["router"]["lru"][f][i]
            s[f"lru_hit_{f}_uniform"] = hits["uniform"]["lru"][f][i]
    mean = {key: sum(s[key] for s in layers if key in s) / sum(key in s for s in layers) for key in layers[1]}
    policies = {source: {p: {f: sum(rates) / L for f, rates in by_size.items()} for p, by_size in by_policy.items()}
                for source, by_policy in hits.items()}
    result = {"model": a.model, "tokens": T, "experts": E, "top_k": k, "text": os.path.basename(DEFAULT_TEXT),
              "uniform_reuse": k / E, "mean": mean, "layers": layers, "locality": LOCALITY,
              "cache_policies": policies}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "routing.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot(result, chosen, E, os.path.join(a.out, "routing.png"))
    print(f"{a.model}: {L} MoE layers, {E} experts, top-{k}, {T} tokens of {result['text']}")
    print(f"{'layer':>5} {'load max/mean':>13} {'entropy':>7} {'reuse':>6} {'from L-1':>8} "
          + " ".join(f"{'LRU ' + str(int(f * 100)) + '%':>8} {'uniform':>7}" for f in fractions))
    for i, s in enumerate(layers + [mean]):
        name = "mean" if i == L else str(i)
        print(f"{name:>5} {s['load_max_over_mean']:13.2f} {s['load_entropy']:7.3f} {s['reuse']:6.3f} "
              f"{s.get('predicted_from_previous_layer', float('nan')):8.3f} "
              + " ".join(f"{s[f'lru_hit_{f}']:8.3f} {s[f'lru_hit_{f}_uniform']:7.3f}" for f in fractions))
    print(f"uniform routing: reuse {k / E:.3f}, from L-1 {k / E:.3f}")
    print("cache hit rate, mean over layers, " + " ".join(f"{int(f * 1000) / 10:>6}%" for f in CACHE_FRACTIONS))
    for source, by_policy in policies.items():
        for p, rates in by_policy.items():
            print(f"{source:>8} {p:>7} " + " ".join(f"{rates[f]:7.3f}" for f in CACHE_FRACTIONS))


def plot(result: dict, chosen: torch.Tensor, E: int, path: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    L = chosen.shape[0]
    load = torch.stack([torch.bincount(chosen[i].flatten(), minlength=E).float() for i in range(L)])
    load = (load / load.mean(1, keepdim=True)).sort(1, descending=True).values
    fig, ax = plt.subplots(1, 4, figsize=(21, 4.5))
    im = ax[0].imshow(load.numpy(), aspect="auto", cmap="viridis")
    ax[0].set(title="expert load / mean (experts sorted per layer)", xlabel="expert rank", ylabel="layer")
    fig.colorbar(im, ax=ax[0])
    layers = result["layers"]
    x = range(L)
    ax[1].plot(x, [s["reuse"] for s in layers], "o-", label="reuse by the next token")
    ax[1].plot(list(x)[1:], [s["predicted_from_previous_layer"] for s in layers[1:]], "s-",
               label="predicted from layer L-1")
    ax[1].axhline(result["uniform_reuse"], color="gray", ls="--", label="uniform routing")
    ax[1].set(title="locality", xlabel="layer", ylabel=f"share of a token's {result['top_k']} experts", ylim=(0, 1))
    ax[1].legend()
    for f, c in ((0.25, "C0"), (0.5, "C1")):
        ax[2].plot(x, [s[f"lru_hit_{f}"] for s in layers], "o-", color=c, label=f"LRU {int(f * 100)}%, this router")
        ax[2].plot(x, [s[f"lru_hit_{f}_uniform"] for s in layers], "--", color=c, label=f"LRU {int(f * 100)}%, uniform")
    ax[2].set(title="expert cache hit rate, batch-1 decode", xlabel="layer", ylabel="hit rate", ylim=(0, 1))
    ax[2].legend()
    for (source, by_policy), c in zip(result["cache_policies"].items(), ("C0", "C1", "C2")):
        for p, style in zip(POLICIES, ("o-", "s--", "^:")):
            ax[3].plot([100 * f for f in CACHE_FRACTIONS], [by_policy[p][f] for f in CACHE_FRACTIONS], style, color=c,
                       label=f"{source}, {p}")
    ax[3].set(title="hit rate against cache size (mean over layers)", xlabel="cache, % of a layer's experts",
              ylabel="hit rate", ylim=(0, 1))
    ax[3].legend(fontsize=7)
    fig.suptitle(f"{result['model']}: routing on {result['tokens']} tokens of {result['text']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
