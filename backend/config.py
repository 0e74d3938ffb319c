"""Model configuration: one frozen dataclass for every supported family, built from the
checkpoint's own `config.json` (or GGUF metadata), never guessed from paths."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

# model_type -> how its MoE router normalises the top-k weights (None: read `norm_topk_prob`).
FAMILIES = {
    "llama": {"moe": False},
    "mistral": {"moe": False},
    "mixtral": {"moe": True, "norm_topk_prob": True},
    "qwen2_moe": {"moe": True, "norm_topk_prob": None},
    "qwen3_moe": {"moe": True, "norm_topk_prob": None},
    "olmoe": {"moe": True, "norm_topk_prob": None},
}


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: str | None = None  # "head" (Qwen3: per head) or "full" (OLMoE: over all heads)
    # Mixture of experts (num_experts == 0: dense MLP everywhere).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    shared_expert_intermediate_size: int = 0
    moe_layers: tuple[int, ...] = ()
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = field(default_factory=tuple)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        model_type = cfg["model_type"]
        if model_type not in FAMILIES:
            raise ValueError(f"unsupported model_type {model_type!r}; supported: {sorted(FAMILIES)}")
        family = FAMILIES[model_type]
        num_heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rope_theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        num_experts = 0
        if family["moe"]:
            num_experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
        num_layers = cfg["num_hidden_layers"]
        sparse_step = cfg.get("decoder_sparse_step", 1) or 1
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        moe_layers = tuple(i for i in range(num_layers)
                           if num_experts and i not in mlp_only and (i + 1) % sparse_step == 0)
        norm_topk = family.get("norm_topk_prob")
        if norm_topk is None:
            norm_topk = bool(cfg.get("norm_topk_prob", False))
        qk_norm = {"qwen3_moe": "head", "olmoe": "full"}.get(model_type)
        eos = cfg.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            intermediate_size=cfg.get("intermediate_size", 0),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=rope if rope_type != "default" else None,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            # Qwen2-MoE has q/k/v biases unless its config says qkv_bias false
            attention_bias=bool(cfg.get("attention_bias") or cfg.get("qkv_bias", model_type == "qwen2_moe")),
            qk_norm=qk_norm,
            num_experts=num_experts,
            num_experts_per_tok=cfg.get("num_experts_per_tok", 0) if num_experts else 0,
            moe_intermediate_size=cfg.get("moe_intermediate_size") or cfg.get("intermediate_size", 0),
            norm_topk_prob=norm_topk,
            shared_expert_intermediate_size=cfg.get("shared_expert_intermediate_size", 0) or 0,
            moe_layers=moe_layers,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos,
        )

    @classmethod
    def from_file(cls, path: str) -> "ModelConfig":
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path) as f:
            return cls.from_hf(json.load(f))
