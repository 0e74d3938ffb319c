"""Named KV cache presets: a format and its options, with the figures measured for them.

Wherever a KV format is named (`alrkvd-eval --kv`, `alrkvd-generate --kv`, the `kv_format` config
parameter, `EngineArgs.kv_format`), a preset name works too; `--kv-opt` / `kv_options` override
single options of the preset. Figures: SmolLM2-135M, WikiText-2 test perplexity at context 2,048
against fp16 KV, compression with a 16-bit window (BENCHMARKS.md section 4).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVPreset:
    kv_format: str
    options: dict
    measured: str  # the figures behind the preset, one line


PRESETS: dict[str, KVPreset] = {
    "alrkvd-cpu": KVPreset("alrkvd", {"block_size": 64, "k_bits": 4, "v_bits": 4, "rank_budget": 8, "latent_bits": 4,
                                      "basis_bits": 4, "scale_bits": 8},
                           "3.32x smaller than 16-bit at +0.40% (first 16k tokens); the CPU server's cache"),
    "alrkvd-gpu": KVPreset("alrkvd", {"block_size": 128, "k_bits": 4, "v_bits": 4, "rank_budget": 8,
                                      "key_frame": "rotated", "codebook": "uniform", "rotate": False,
                                      "basis_solver": "subspace", "rank_max": 16},
                           "3.36x in closed blocks (2.78x with its 16-bit window at a 2k context) at +0.54% / +0.59% "
                           "/ +0.79% on three texts; the options the fused GPU kernels read. Blocks of 128, not 64: "
                           "half the basis work a token (a long-context mix's prompt tokens 1.14x faster, H100)"),
    "alrkvd-gpu-3.7x": KVPreset("alrkvd", {"block_size": 64, "k_bits": 4, "v_bits": 2, "rank_budget": 8,
                                           "key_frame": "rotated", "codebook": "uniform", "rotate": False,
                                           "basis_solver": "subspace", "rank_max": 16, "rotate_values": True},
                                "3.68x at +2.25% / +2.78% / +2.38% on three texts, but pass keys lost at 8k (0/2; fp16 "
                                "and alrkvd-gpu 2/2); read by the fused GPU kernels: 2-bit values rotated by a "
                                "Hadamard folded into the model's value and output projections"),
    "alrkvd-4.5x": KVPreset("alrkvd", {"block_size": 32, "k_bits": 3, "v_bits": 3, "rank_budget": 16, "key_weight": 16,
                                       "latent_bits": 3, "basis_bits": 4, "scale_bits": 8, "v_low_tokens": 25,
                                       "v_low_bits": 2, "codebook": "trellis", "trellis_state_bits": 12,
                                       "sink_tokens": 1},
                            "4.52x at +0.82% (first 16k tokens), +0.96% over three texts; PyTorch path only"),
    "alrkvd-6x": KVPreset("alrkvd", {"block_size": 32, "k_bits": 2, "v_bits": 2, "rank_budget": 8, "key_weight": 8,
                                     "latent_bits": 3, "basis_bits": 4, "scale_bits": 8},
                          "6.04x at +7.24% (held-out text +5.73%), every pass key fp16 finds; PyTorch path only"),
}


def resolve_kv(name: str, overrides: dict | None = None) -> tuple[str, dict]:
    """(kv format, options) for a preset or format name; `overrides` win over a preset's options."""
    preset = PRESETS.get(name)
    if preset is None:
        return name, dict(overrides or {})
    return preset.kv_format, {**preset.options, **(overrides or {})}
