"""The model repository's configs: engine options map onto EngineArgs, the dummy MoE's config."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from server.model_config import parameters  # a config.pbtxt's parameters, as Triton hands them to model.py

REPO = Path(__file__).resolve().parents[2] / "model_repository"
CONFIGS = sorted(REPO.glob("*/config.pbtxt")) + sorted(REPO.glob("*/configs/*.pbtxt"))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "smollm2" / "1" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("pbtxt", CONFIGS, ids=[str(p.relative_to(REPO)) for p in CONFIGS])
def test_config_is_decoupled_python_with_engine_parameters(pbtxt):
    from backend.engine import EngineArgs

    text = pbtxt.read_text()
    model_dir = pbtxt.parent if pbtxt.parent.name != "configs" else pbtxt.parent.parent
    assert f'name: "{model_dir.name}"' in text
    assert 'backend: "python"' in text and "decoupled: true" in text
    params = parameters(pbtxt)
    for key in ("max_num_seqs", "max_num_batched_tokens", "max_queue_size", "scheduling_policy",
                "kv_format", "kv_budget_bytes", "max_model_len", "model"):
        assert key in params, f"{pbtxt}: no {key}"
    args = _load("engine_config").engine_args_from_config({"parameters": params}, str(model_dir), EngineArgs)
    assert isinstance(args.max_num_seqs, int) and isinstance(args.kv_budget_bytes, int)
    assert isinstance(args.kv_options, dict)
    if params["model"]["string_value"] not in ("default", "smollm2-moe"):  # named models; others are paths
        assert Path(args.model).exists()


def test_gpu_config_kv_options_are_the_decode_kernels():
    """On the GPU the smollm2 model's ALR-KVD cache is read by the fused kernel, not the PyTorch path."""
    import torch

    from backend.engine import EngineArgs
    from backend.kv_formats import make_format
    from kernels.alrkvd_attention import AlrkvdLayer

    params = parameters(REPO / "smollm2" / "configs" / "gpu.pbtxt")
    args = _load("engine_config").engine_args_from_config({"parameters": params}, str(REPO / "smollm2"), EngineArgs)
    from backend.kv_presets import resolve_kv

    kv_format, options = resolve_kv(args.kv_format, args.kv_options)
    assert kv_format == "alrkvd"
    block_size = options.pop("block_size")
    fmt = make_format("alrkvd", 1, 3, 64, torch.float16, "meta", num_blocks=1, block_size=block_size, **options)
    AlrkvdLayer.from_format(fmt, 0)  # NotImplementedError for options the kernel does not read


def test_unknown_or_ill_typed_parameters_fail_the_load():
    from backend.engine import EngineArgs

    ec = _load("engine_config")
    with pytest.raises(ValueError, match="not an engine option"):
        ec.engine_args_from_config({"parameters": {"max_num_sequences": {"string_value": "4"}}}, ".", EngineArgs)
    with pytest.raises(ValueError, match="max_num_seqs"):
        ec.engine_args_from_config({"parameters": {"max_num_seqs": {"string_value": "four"}}}, ".", EngineArgs)
    args = ec.engine_args_from_config({"parameters": {"max_model_len": {"string_value": "none"}}}, ".",
                                      EngineArgs, {"device": "cuda:1"})
    assert args.max_model_len is None and args.device == "cuda:1"


def test_dummy_moe_is_a_scaled_down_qwen3_moe():
    from backend.config import ModelConfig

    path = REPO / "qwen3moe_dummy" / "hf_config" / "config.json"
    raw = json.loads(path.read_text())
    assert raw["model_type"] == "qwen3_moe"
    cfg = ModelConfig.from_file(str(path))
    assert cfg.is_moe and (cfg.num_experts, cfg.num_experts_per_tok) == (8, 2)
    assert (cfg.num_layers, cfg.hidden_size, cfg.moe_intermediate_size) == (4, 256, 128)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 64)
    assert cfg.vocab_size == 49152  # the SmolLM2 tokenizer's
    assert cfg.moe_layers == (0, 1, 2, 3)


def test_both_models_share_one_implementation():
    dummy = REPO / "qwen3moe_dummy" / "1"
    assert dummy.is_symlink() and dummy.resolve() == (REPO / "smollm2" / "1").resolve()


def test_server_options_and_thread_override(monkeypatch):
    ec = _load("engine_config")
    params = parameters(REPO / "smollm2" / "config.pbtxt")
    monkeypatch.delenv("ALRKVD_TORCH_THREADS", raising=False)
    assert ec.server_options({"parameters": params}) == {"torch_num_threads": 0}
    monkeypatch.setenv("ALRKVD_TORCH_THREADS", "1")
    assert ec.server_options({"parameters": params})["torch_num_threads"] == 1
    with pytest.raises(ValueError, match="torch_num_threads"):
        ec.server_options({"parameters": {"torch_num_threads": {"string_value": "many"}}})


def test_variant_repository_changes_only_the_named_parameters(tmp_path):
    from server.model_config import variant_repository

    repo = variant_repository(tmp_path, "smollm2", {"max_queue_size": "2", "kv_options": '{"k_bits": 3}'})
    params, base = parameters(repo / "smollm2" / "config.pbtxt"), parameters(REPO / "smollm2" / "config.pbtxt")
    assert params["max_queue_size"]["string_value"] == "2"
    assert json.loads(params["kv_options"]["string_value"]) == {"k_bits": 3}
    assert {k: v for k, v in params.items() if k not in ("max_queue_size", "kv_options")} == \
        {k: v for k, v in base.items() if k not in ("max_queue_size", "kv_options")}
    assert (repo / "smollm2" / "1").resolve() == (REPO / "smollm2" / "1").resolve()
    with pytest.raises(ValueError, match="no parameter 'max_queue'"):
        variant_repository(tmp_path / "other", "smollm2", {"max_queue": "2"})


def test_dummy_repository_streams_experts_on_request(tmp_path, monkeypatch):
    """server/dummy_repository.py (the H200's load-test models): `--expert-fraction` gives the engine an expert
    budget of that share of the shape's routed-expert bytes, which the config parser hands to EngineArgs."""
    from backend.engine import EngineArgs
    from server import dummy_repository

    monkeypatch.setattr("sys.argv", ["dummy_repository", "--out", str(tmp_path), "--name", "q", "--moe-routing",
                                     "local", "--expert-fraction", "0.5"])
    dummy_repository.main()
    params = parameters(tmp_path / "q" / "config.pbtxt")
    args = _load("engine_config").engine_args_from_config({"parameters": params}, str(tmp_path / "q"), EngineArgs)
    expected = dummy_repository.routed_expert_bytes(dummy_repository.SHAPES["qwen3-30b-a3b"]) // 2
    assert args.expert_budget_bytes == expected and 28e9 < expected < 30e9
    assert args.moe_routing == "local" and not args.enforce_eager
    assert args.layered_prefill == 0  # streamed experts do not layer


@pytest.mark.parametrize("flags, layered", [([], 8), (["--kv-format", "alrkvd-gpu"], 8), (["--kv-format", "kivi2"], 0),
                                            (["--kv-format", "int8"], 0), (["--kv-format", "full"], 0),
                                            (["--kv-format", "alrkvd-gpu", "--layered-prefill", "4"], 4),
                                            (["--layered-prefill", "0"], 0)])
def test_dummy_repository_layers_prefill_where_its_steps_are_graphs(tmp_path, monkeypatch, flags, layered):
    """The load-test models layer prompt chunks beside decodes (groups of 8) by default with the caches whose layered
    steps were timed as graphs (the GPU config's fp16, ALR-KVD), not with the others (int8: no kernels; KIVI: not
    timed as graphs); the flag wins."""
    from backend.engine import EngineArgs
    from server import dummy_repository

    monkeypatch.setattr("sys.argv", ["dummy_repository", "--out", str(tmp_path), "--name", "q", *flags])
    dummy_repository.main()
    for variant in ("q", "q_eager"):
        params = parameters(tmp_path / variant / "config.pbtxt")
        args = _load("engine_config").engine_args_from_config({"parameters": params}, str(tmp_path / variant),
                                                              EngineArgs)
        assert args.layered_prefill == layered
