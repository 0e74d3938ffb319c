"""One transformer for every supported family: Llama (dense), Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE.

Tokens of all sequences in a step are flattened into one dimension T (continuous batching);
attention goes through the paged KV cache, which knows each sequence's context.
Parameter names follow the Hugging Face checkpoints so that loading is a plain state_dict.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from backend.config import ModelConfig
from kernels.moe_reference import grouped_experts, moe_route_ref

# The fused Triton kernels (kernels/) take CUDA tensors; tests set this to run them on CPU tensors too, under
# Triton's interpreter, and check the CUDA path's arithmetic without a GPU.
KERNELS_ON_CPU = False


def fused(x: torch.Tensor) -> bool:
    """Whether x takes the fused-kernel path."""
    return x.is_cuda or KERNELS_ON_CPU


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused(x) and x.dim() == 2:  # one launch instead of four
            from kernels.norms import rms_norm
            return rms_norm(x, self.weight, self.eps)
        # in fp32, cast back before the weight, as HF does
        return self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, the norm of that sum): a pre-norm block's residual stream. On CUDA x may be a MoE's
        unreduced pairs [T, top_k, H], summed in the same launch."""
        if fused(x):
            from kernels.norms import rms_norm
            return rms_norm(x, self.weight, self.eps, residual)
        x = x + residual
        return x, self(x)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies with the config's scaling (default, linear, llama3)."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(wavelen > old_len / low, inv_freq / factor,
                               torch.where(wavelen < old_len / high, inv_freq, scaled))
    elif kind is not None:
        raise ValueError(f"unsupported rope scaling {kind!r}")
    return inv_freq.float()


class Rotary:
    """Precomputed cos/sin tables; `apply` rotates [T, H, D] by each token's position (HF's half-split layout)."""

    def __init__(self, cfg: ModelConfig, max_len: int, device):
        inv_freq = rope_inv_freq(cfg)
        t = torch.arange(max_len, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos().to(device)
        self.sin = emb.sin().to(device)
        # rotate_half(x) * sin == roll(x, D/2) * [-sin, sin]: one op fewer per rotation
        self.signed_sin = torch.cat([-freqs.sin(), freqs.sin()], dim=-1).to(device)

    def at(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin [T, 1, D] of each position: looked up once per step, shared by every layer."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.signed_sin[positions].unsqueeze(1).to(dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.rotate(x, *self.at(positions, x.dtype))


# Eager CUDA GEMMs of more than GEMM_ROWS rows run on a multiple of it: cuBLAS chooses its kernel on the first call
# of each (rows, in, out), 3-7 ms of host time (H100, cuBLAS 13; journal 2026-12-06 31a), which eager prompt chunks of
# every length paid at nearly every step (a layered group's first layers: +11 ms). Padded, the sizes are few, and
# `Transformer.warm_up_kernels` runs them all at start-up.
GEMM_ROWS = 64


class Linear(nn.Linear):
    """nn.Linear whose eager calls on the fused-kernel path (CUDA) on more than GEMM_ROWS rows pad them to a multiple
    of it (at most 63 rows; graph captures keep their sizes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        if (T > GEMM_ROWS and T % GEMM_ROWS and fused(x)
                and not (x.is_cuda and torch.cuda.is_current_stream_capturing())):  # (decode rows check no more)
            return F.linear(F.pad(x, (0, 0, 0, -T % GEMM_ROWS)), self.weight, self.bias)[:T]
        return super().forward(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # q, k and v in one GEMM (the loader concatenates HF's q_proj, k_proj, v_proj)
        self.qkv_sizes = [cfg.num_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2
        self.qkv_proj = Linear(cfg.hidden_size, sum(self.qkv_sizes), bias=cfg.attention_bias)
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm == "head":
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        elif cfg.qk_norm == "full":
            self.q_norm = RMSNorm(cfg.num_heads * cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.num_kv_heads * cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, x, rope, kv_cache, batch) -> torch.Tensor:
        """rope: the step's (cos, sin) from `Rotary.at`."""
        T = x.shape[0]
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split(self.qkv_sizes, dim=-1)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if fused(qkv) and self.qk_norm != "full":  # per-head norms and RoPE in one launch
            from kernels.norms import qk_norm_rope
            norms = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps) if self.qk_norm else (None, None, 0.0)
            q, k, k_rot = qk_norm_rope(qkv, self.num_heads, self.num_kv_heads, self.head_dim, *norms, *rope)
        else:
            if self.qk_norm == "full":
                q, k = self.q_norm(q), self.k_norm(k)
            q = q.view(T, self.num_heads, self.head_dim)
            k = k.view(T, self.num_kv_heads, self.head_dim)
            if self.qk_norm == "head":
                q, k = self.q_norm(q), self.k_norm(k)
            q, k_rot = Rotary.rotate(q, *rope), Rotary.rotate(k, *rope)
        # The cache gets both key forms: its format decides whether it stores keys before RoPE.
        out = kv_cache.attend(self.layer_id, q, k, k_rot, v, batch)  # [T, Hq, D]
        return self.o_proj(out.reshape(T, -1))

    @torch.no_grad()
    def fold_value_rotation(self, c: torch.Tensor):
        """Values become v @ c and o_proj takes c back (c orthogonal [D, D]): the layer's output is unchanged.
        v = x W_v^T, so W_v <- c^T W_v per kv head (and its bias b @ c); each query head's output o becomes o c,
        so W_o <- W_o c on its columns. Products in float32, rounded once to the weights' dtype."""
        if isinstance(self.qkv_proj, FP16Linear) or isinstance(self.o_proj, FP16Linear):
            raise ValueError("rotate_values folds into the projections' weights: not with weight_dtype=float16")
        D, Hkv = self.head_dim, self.num_kv_heads
        c = c.to(self.qkv_proj.weight.device, torch.float32)
        w_v = self.qkv_proj.weight[-Hkv * D:]
        w_v.copy_(torch.einsum("de,hdi->hei", c, w_v.float().view(Hkv, D, -1)).reshape(w_v.shape))
        if self.qkv_proj.bias is not None:
            b_v = self.qkv_proj.bias[-Hkv * D:]
            b_v.copy_((b_v.float().view(Hkv, D) @ c).reshape(-1))
        w_o = self.o_proj.weight
        w_o.copy_((w_o.float().view(w_o.shape[0], -1, D) @ c).reshape(w_o.shape))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_up_proj = Linear(hidden, 2 * inter, bias=False)  # HF's gate_proj and up_proj, stacked
        self.down_proj = Linear(inter, hidden, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class MoE(nn.Module):
    """Top-k routed experts (+ optional gated shared expert, Qwen2-MoE).

    Expert weights are stacked: w13 [E, 2I, H] (gate rows, then up rows) and w2 [E, H, I], the
    layout of the fused Triton kernel (kernels/fused_moe.py), which runs them on CUDA. On CPU,
    compute groups tokens by expert: sort the (token, expert) pairs by expert, run each expert on
    its contiguous slice, scatter back.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        E, H, I = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.top_k, self.norm_topk_prob = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = Linear(H, E, bias=False)
        self.w13 = nn.Parameter(torch.empty(E, 2 * I, H))
        self.w2 = nn.Parameter(torch.empty(E, H, I))
        self.shared_expert = None
        if cfg.shared_expert_intermediate_size:
            self.shared_expert = MLP(H, cfg.shared_expert_intermediate_size)
            self.shared_expert_gate = Linear(H, 1, bias=False)
        self.experts = None  # an ExpertCache (backend/experts.py) replaces the stacked weights when streaming
        self.dense = None    # DenseExperts replaces them on the CPU when the experts are tiny (`densify`)
        self.seeded_routes = None  # [buckets, top_k] experts per bucket: seeded routing (`seed_routing`)
        self.predicted_routes = None  # [buckets, top_k] what a prefetcher names per bucket (`prefetch_logits`)
        self.route_keys = None     # [T] each token's bucket, set by the forward when routing is seeded
        self.valid_rows = None     # [T] bool: a graph's padding rows are False (set by the forward)
        self.routed_tokens = None  # [E] float64: tokens routed to each expert, when the engine counts them
        self.routed_ones = None    # ones to add, as many as a step's (token, expert) pairs (shared by layers)

    def route(self, x: torch.Tensor, align: bool = False, counts=None) -> tuple[torch.Tensor, ...]:
        """(weights [T, top_k] in x's dtype, expert ids [T, top_k]). Seeded: the experts of the token's
        bucket, their weights from the router. A graph's padding rows (`valid_rows` False) take the first row's
        experts at weight 0: no expert of their own. `align` (one token, the fused kernels): also the pairs'
        alignment for `fused_moe`, `counts` added to in the same launch (`moe_route`)."""
        seeded = (self.seeded_routes, self.route_keys) if self.seeded_routes is not None else (None, None)
        if fused(x):  # one launch instead of some eight
            from kernels.fused_moe import moe_route
            return moe_route(self.gate(x), self.top_k, self.norm_topk_prob, *seeded, self.valid_rows, align, counts)
        return moe_route_ref(self.gate(x), self.top_k, self.norm_topk_prob, *seeded, self.valid_rows)

    def prefetch_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits an expert prefetcher ranks this layer's experts by, from the previous MoE layer's input x
        (backend/experts.py): this router's; with seeded routing that has a predictability, ones at the
        experts the blurred tables name for the tokens' buckets (a dummy model's router is unrelated to them)."""
        if self.predicted_routes is None:
            return self.gate(x)
        ids = self.predicted_routes[self.route_keys[: x.shape[0]]]
        return torch.zeros(x.shape[0], self.gate.out_features, device=x.device).scatter_(1, ids, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, H]; on CUDA with resident experts and no shared expert, the unreduced pairs [T, top_k, H], which
        the next RMSNorm sums (`RMSNorm.add_and_norm`): one launch fewer."""
        kernel = fused(x) and self.experts is None
        counts = None if self.routed_tokens is None else (self.routed_tokens, self.routed_ones)
        align = None
        if kernel and x.shape[0] == 1:  # a decode step at batch 1: no sort launch, its pairs laid out by the routing
            weights, ids, align = self.route(x, align=True, counts=counts)
        else:
            weights, ids = self.route(x)
        if self.routed_tokens is not None and not kernel:  # on the device, no sync: captured in graphs too
            self.routed_tokens.index_add_(0, ids.flatten(), self.routed_ones[: ids.numel()])
        if self.experts is not None:
            out = self.experts.run(x, weights, ids)
        elif self.dense is not None:
            out = self.dense(x, weights, ids)
        elif kernel:  # the routed-token counts are added by the kernel that sorts the pairs (or routes them)
            from kernels.fused_moe import fused_moe
            out = fused_moe(x, self.w13, self.w2, weights, ids, expert_counts=counts,
                            reduce=self.shared_expert is not None, align=align)
        else:
            gate, up = self.w13.chunk(2, dim=1)
            out = grouped_experts(x, weights, ids, self.gate.out_features, lambda e: (gate[e], up[e], self.w2[e]))
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out

    def densify(self):
        """Run the routed experts as one `DenseExperts` (their stacked weights move into it)."""
        self.dense = DenseExperts(self.w13.detach(), self.w2.detach())
        del self.w13, self.w2


class DenseExperts(nn.Module):
    """All routed experts of an MoE layer as one dense FFN, the routing a mask on its neurons. On the CPU,
    experts of a few neurons (a dense model split into experts: 8) are too small for a matmul each: two GEMMs
    over every expert cost what the dense FFN costs, against three tiny matmuls per routed expert (SmolLM2 split
    128 x 8, top 32, one layer: 0.11 against 0.67 ms for one token, 0.25 against 3.4 for eight; journal
    2026-12-05 21a; fp16 weights, as served). Experts the step does not route get weight 0."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor):
        super().__init__()
        E, two_i, H = w13.shape
        self.num_experts, self.inter = E, two_i // 2
        self.gate_up = Linear(H, E * two_i, bias=False)   # rows: expert 0's gate, its up, expert 1's gate, ...
        self.down = Linear(E * self.inter, H, bias=False)  # columns: expert 0's neurons, expert 1's, ...
        self.gate_up.weight = nn.Parameter(w13.reshape(E * two_i, H), requires_grad=False)
        self.down.weight = nn.Parameter(w2.permute(1, 0, 2).reshape(H, E * self.inter), requires_grad=False)

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        gate, up = self.gate_up(x).view(T, self.num_experts, 2, self.inter).unbind(2)
        mask = torch.zeros(T, self.num_experts, dtype=x.dtype, device=x.device).scatter_(1, ids, weights.to(x.dtype))
        return self.down((F.silu(gate) * up * mask[..., None]).view(T, -1))


# Experts whose three projections hold fewer weights than this run densely on the CPU (`DenseExperts`): SmolLM2's
# split (8 neurons x 576: 13.8k) does; Qwen3-30B-A3B's (768 x 2,048: 4.7M) or OLMoE's keep one matmul per expert.
DENSE_EXPERT_MAX_WEIGHTS = 1 << 16


def densify_small_experts(model: nn.Module):
    """`MoE.densify` every MoE layer whose experts are small (`DENSE_EXPERT_MAX_WEIGHTS`): the CPU's choice (not
    where tests run the fused kernels on CPU tensors)."""
    if KERNELS_ON_CPU:
        return
    for m in model.modules():
        if isinstance(m, MoE) and m.experts is None and m.w13[0].numel() + m.w2[0].numel() < DENSE_EXPERT_MAX_WEIGHTS:
            m.densify()


class FP16Linear(nn.Module):
    """A Linear whose weight is packed in fp16 for FBGEMM's fp16 GEMM (CPU): decode reads half the
    bytes of fp32 weights, while activations and accumulation stay fp32."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        bias = None if linear.bias is None else linear.bias.float()
        self.packed = torch.ops.quantized.linear_prepack_fp16(linear.weight.float(), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x, self.packed)


def pack_fp16_linears(model: nn.Module):
    """Swap every nn.Linear for an FP16Linear, except MoE routers (routing stays exact)."""
    for parent in list(model.modules()):
        routers = ("gate", "shared_expert_gate") if isinstance(parent, MoE) else ()
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and name not in routers:
                setattr(parent, name, FP16Linear(child))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_id)
        self.mlp = MoE(cfg) if layer_id in cfg.moe_layers else MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h, residual, rope, kv_cache, batch):
        """Pre-norm block on the residual stream: takes the previous block's output `h` not yet added to
        `residual` (None for the first block), returns this block's (h, residual), so that each add
        goes with the norm after it."""
        if residual is None:
            residual, x = h, self.input_layernorm(h)
        else:
            residual, x = self.input_layernorm.add_and_norm(h, residual)
        h = self.self_attn(x, rope, kv_cache, batch)
        residual, x = self.post_attention_layernorm.add_and_norm(h, residual)
        return self.mlp(x), residual


def local_routes(num_experts: int, top_k: int, buckets: int, load_skew: float, reuse: float,
                 seed: int) -> torch.Tensor:
    """Routing tables [buckets, top_k] with a trained router's locality, as a chain over consecutive buckets:
    bucket b + 1 keeps a Binomial(top_k, reuse) share of bucket b's experts and draws the rest, by a Zipf
    popularity over the experts (their order drawn from `seed`), from those b did not use. The exponent makes
    the busiest expert's load over the mean `load_skew` (`_zipf_exponent`). Measured on SmolLM2 split into
    experts (benchmarks/moe_routing.py): skew 2.16, reuse 0.43 at 32 of 128 experts (uniform: 0.25)."""
    assert 2 * top_k <= num_experts, "reuse is drawn apart from the previous experts: top_k at most half of them"
    exponent = _zipf_exponent(num_experts, top_k, buckets, load_skew, reuse)
    return torch.from_numpy(_route_chain(num_experts, top_k, buckets, reuse, exponent, seed))


def _route_chain(num_experts: int, top_k: int, buckets: int, reuse: float, exponent: float, seed: int):
    rng = np.random.default_rng(seed)
    log_p = -exponent * np.log(np.arange(1.0, num_experts + 1))[rng.permutation(num_experts)]
    out = np.empty((buckets, top_k), dtype=np.int64)
    out[0] = np.argsort(-(log_p + rng.gumbel(size=num_experts)))[:top_k]
    for b in range(1, buckets):
        kept = rng.permutation(out[b - 1])[:rng.binomial(top_k, reuse)]
        scores = log_p + rng.gumbel(size=num_experts)  # Gumbel top-k: draws without replacement by popularity
        scores[out[b - 1]] = -np.inf
        out[b] = np.concatenate([kept, np.argsort(-scores)[:top_k - len(kept)]])
    return out


def blur_routes(routes: torch.Tensor, num_experts: int, keep: float, seed: int) -> torch.Tensor:
    """A copy of routing tables [buckets, top_k] in which each expert is kept with probability `keep` and
    otherwise replaced by one the row does not hold: what a prefetcher of that recall would name."""
    rng = np.random.default_rng(seed)
    out = routes.numpy().copy()
    for row in out:
        lost = rng.random(len(row)) >= keep
        others = np.setdiff1d(np.arange(num_experts), row)
        row[lost] = rng.choice(others, size=int(lost.sum()), replace=False)
    return torch.from_numpy(out)


@functools.lru_cache
def _zipf_exponent(num_experts: int, top_k: int, buckets: int, load_skew: float, reuse: float) -> float:
    """The popularity exponent whose chain has the busiest expert at `load_skew` times the mean load: bisection
    over chains of one seed (the same draws for every exponent, so the skew moves smoothly with it)."""
    lo, hi = 0.0, 4.0
    for _ in range(12):
        mid = (lo + hi) / 2
        routes = _route_chain(num_experts, top_k, buckets, reuse, mid, seed=0)
        busiest = np.bincount(routes.ravel(), minlength=num_experts).max() * num_experts / routes.size
        lo, hi = (mid, hi) if busiest < load_skew else (lo, mid)
    return (lo + hi) / 2


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary: Rotary | None = None
        self.value_rotation = None  # the rotation folded into the value projections (`rotate_values`)
        self.seeded_routing = 0  # buckets of seeded routing; 0: learned routing
        self.route_stride = 7919

    def seed_routing(self, seed: int, buckets: int = 4096, locality: tuple[float, float] | None = None,
                     pregating_recall: float | None = None):
        """Route every token by a hash of its position and its row in the step, not by its hidden state: each
        bucket has its own top-k experts, drawn from `seed`, per MoE layer; the router's weights stay. For
        benchmarks on dummy weights, so that arms that compute different activations (KV formats, graphs or
        eager) run the same experts, whatever ran before. Meaningless for a real model.
        `locality` (load skew, reuse): instead of uniform draws, tables with a trained router's statistics
        (`local_routes`), and consecutive positions of a row in consecutive buckets, so that a decoding
        sequence's next token reuses experts as it would there (while its row in the batch stays; a prompt
        chunk's tokens, one row each, do not). `pregating_recall`: expert prefetchers name a layer's experts from
        tables that keep that share of them (`blur_routes`), as a trained router predicts the next layer's."""
        for i, m in enumerate(m for m in self.modules() if isinstance(m, MoE)):
            E = m.gate.out_features
            if locality is None:
                g = torch.Generator().manual_seed(seed * 1009 + i)
                routes = torch.stack([torch.randperm(E, generator=g)[:m.top_k] for _ in range(buckets)])
            else:
                routes = local_routes(E, m.top_k, buckets, *locality, seed=seed * 1009 + i)
            m.seeded_routes = routes.to(self.embed_tokens.weight.device)
            if pregating_recall is not None:
                blurred = blur_routes(routes, E, pregating_recall, seed * 1009 + i + 1)
                m.predicted_routes = blurred.to(m.seeded_routes.device)
        self.seeded_routing = buckets
        self.route_stride = 7919 if locality is None else 1  # position -> bucket: scattered, or consecutive

    def rotate_values(self, rotation: torch.Tensor | None):
        """Fold an orthogonal `rotation` R [D, D] into every layer's value and output projections (None: none), so
        that the KV cache holds V R while the model computes what it did (`Attention.fold_value_rotation`): after
        a randomized Hadamard a value's entries are near-Gaussian, without outlier channels, and low-bit codes of
        a token lose less (`rotate_values`, backend/kv_cache.py). Replaces any rotation folded before."""
        old = self.value_rotation
        if old is rotation:  # none, or the same constant (`rotation_matrix` returns one tensor per seed)
            return
        eye = torch.eye(self.cfg.head_dim, dtype=torch.float64)
        change = (eye if old is None else old.double()).t() @ (eye if rotation is None else rotation.double())
        for layer in self.layers:
            layer.self_attn.fold_value_rotation(change)
        self.value_rotation = rotation

    def setup_rotary(self, max_len: int):
        self.rotary = Rotary(self.cfg, max_len, self.embed_tokens.weight.device)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, kv_cache, batch) -> torch.Tensor:
        """tokens, positions: [T]. Returns final hidden states [T, hidden]."""
        x, residual = self.forward_layers(self.embed_tokens(tokens), None, positions, kv_cache, batch)
        return self.final_norm(x, residual)

    @torch.no_grad()
    def warm_up_kernels(self, max_rows: int):
        """What eager steps of any number of rows up to `max_rows` would otherwise do on their first call (CUDA):
        cuBLAS's choice for each GEMM shape at each row count a `Linear` runs (1 to GEMM_ROWS, then its multiples),
        and the fused MoE's compiles, once per `moe_kernel_variant` (600-1,000 ms each)."""
        device = self.embed_tokens.weight.device
        if not fused(self.embed_tokens.weight):
            return
        linears = {(m.in_features, m.out_features, m.bias is None, m.weight.dtype): m
                   for m in self.modules() if isinstance(m, Linear)}
        rows = [*range(1, GEMM_ROWS + 1), *range(2 * GEMM_ROWS, max_rows + GEMM_ROWS, GEMM_ROWS)]
        for m in linears.values():
            sizes = rows if m is not self.lm_head else rows[:GEMM_ROWS]  # (the rows sampled: a few a sequence)
            x = torch.zeros(sizes[-1], m.in_features, dtype=m.weight.dtype, device=device)
            for T in sizes:
                m(x[:T])
        moe = next((m for m in self.modules() if isinstance(m, MoE) and m.experts is None and m.dense is None), None)
        if moe is None:
            return
        from kernels.fused_moe import fused_moe, moe_kernel_variant
        E, k = moe.gate.out_features, moe.top_k
        first = {}  # each variant's fewest rows
        for T in range(1, max_rows + 1):
            first.setdefault(moe_kernel_variant(T * k, E), T)
        sizes = sorted(first.values())
        x = torch.zeros(sizes[-1], moe.w13.shape[2], dtype=moe.w13.dtype, device=device)
        for T in sizes:
            ids = torch.arange(T * k, device=device).view(T, k) % E
            fused_moe(x[:T], moe.w13, moe.w2, torch.ones(T, k, dtype=x.dtype, device=device), ids)

    def forward_layers(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, kv_cache, batch,
                       first: int = 0, last: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Layers [first, last) on the residual stream (`Block`'s h and residual; x embedded and residual None at
        layer 0): a prompt chunk can go through the layers over several steps (layered prefill)."""
        layers = self.layers[first:last]
        rope = self.rotary.at(positions, x.dtype)
        keys = None
        if self.seeded_routing:  # on the device, from the step's own buffers: captured in CUDA graphs too
            rows = torch.arange(x.shape[0], device=x.device)
            keys = (positions * self.route_stride + rows * 104729) % self.seeded_routing
        for layer in layers:
            if isinstance(layer.mlp, MoE):
                layer.mlp.route_keys, layer.mlp.valid_rows = keys, getattr(batch, "valid_rows", None)
        for layer in layers:
            x, residual = layer(x, residual, rope, kv_cache, batch)
        return x, residual

    def final_norm(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.norm.add_and_norm(x, residual)[1]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
