"""Mixture of experts in PyTorch, no Triton: `moe_route_ref` and `grouped_experts`, the CPU path of the engine's
MoE layers (backend/model.py, backend/experts.py) and the references of the Triton kernels (kernels/fused_moe.py).
Nothing runs at import.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def moe_route_ref(logits, top_k, normalize, routes=None, keys=None, valid=None):
    """Router logits [T, E] -> (weights [T, top_k], ids): see kernels.fused_moe.moe_route."""
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    if routes is not None:
        ids = routes[keys]
        weights = probs.gather(1, ids)
    else:
        weights, ids = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    if valid is not None:  # padding rows: row 0's experts at weight 0
        ids = torch.where(valid[:, None], ids, ids[:1])
        weights = weights * valid[:, None]
    return weights.to(logits.dtype), ids


def grouped_experts(x, weights, ids, num_experts: int, expert_weights):
    """Sort (token, expert) pairs by expert and run each expert once on its contiguous tokens.

    x [T, H], weights/ids [T, k]; `expert_weights(e)` returns expert e's (gate, up, down).
    """
    k = ids.shape[1]
    flat_ids = ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    token_of = order // k
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    xs = x[token_of]
    ys = torch.empty_like(xs)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        g, u, d = expert_weights(e)
        xe = xs[start:start + n]
        ys[start:start + n] = (F.silu(xe @ g.T) * (xe @ u.T)) @ d.T
        start += n
    ys = ys * weights.reshape(-1)[order].unsqueeze(-1)
    out = torch.zeros_like(x)
    out.index_add_(0, token_of, ys)
    return out
