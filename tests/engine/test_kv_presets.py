"""Named KV presets: each builds its format, allocates the bytes its measured figures were taken with,
and runs through `alrkvd-eval` by name (the output states the preset's options)."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backend.config import ModelConfig
from backend.kv_cache import meta_format
from backend.kv_presets import PRESETS, resolve_kv

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = ModelConfig(model_type="llama", vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9,
                      num_kv_heads=3, head_dim=64, intermediate_size=1536)
# block bytes per token as allocated when the book's figures were measured (its result files)
MEASURED_BLOCK_BYTES_PER_TOKEN = {"alrkvd-4.5x": 4721.25, "alrkvd-6x": 3457.5}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_builds_its_format(name):
    kv_format, options = resolve_kv(name)
    fmt = meta_format(SMOLLM2, kv_format, options, torch.float32)
    if name in MEASURED_BLOCK_BYTES_PER_TOKEN:
        assert fmt.bytes_per_block() / fmt.block_size == MEASURED_BLOCK_BYTES_PER_TOKEN[name]


@pytest.mark.parametrize("name", ["alrkvd-gpu", "alrkvd-gpu-3.7x"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_gpu_presets_are_read_by_the_decode_kernel_at_any_head_dim(name, head_dim):
    # with a scale group of 64 the Qwen3-30B-A3B shape (head_dim 128) fell to the PyTorch path on the H200:
    # every decode step rebuilt every compressed block, and a Locust run finished one request in 120 s
    fmt = meta_format(dataclasses.replace(SMOLLM2, head_dim=head_dim), *resolve_kv(name), torch.float16)
    assert fmt.options["group"] == head_dim and fmt.kernels(max_rows=2) is not None


def test_overrides_win_over_the_preset():
    kv_format, options = resolve_kv("alrkvd-6x", {"k_bits": "3"})
    assert kv_format == "alrkvd" and options["k_bits"] == "3" and options["block_size"] == 32
    assert resolve_kv("fp16") == ("fp16", {})


def test_eval_takes_a_preset_by_name():
    out = subprocess.run([sys.executable, "-m", "backend.evaluate", "perplexity", "--kv", "alrkvd-6x",
                          "--max-tokens", "80", "--context", "64", "--chunk", "32", "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["preset"] == "alrkvd-6x" and res["kv"] == "alrkvd"
    assert {k: res["kv_options"][k] for k in ("block_size", "k_bits", "v_bits", "rank_budget")} == \
        {"block_size": 32, "k_bits": 2, "v_bits": 2, "rank_budget": 8}
    assert res["ppl"] > 1
