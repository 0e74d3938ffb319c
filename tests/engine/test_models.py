"""Every supported family against transformers on tiny random checkpoints written by the test; also the engine's
CUDA path (in float32), where its Triton kernels (norms, RoPE, MoE, the KV write, paged attention) replace
PyTorch: on the GPU where there is one, and on the CPU under Triton's interpreter (`cpu-kernels`)."""
import contextlib
from unittest import mock

from kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from backend import model as model_module  # noqa: E402
from backend.engine import EngineArgs, LLMEngine  # noqa: E402
from backend.sampling import SamplingParams  # noqa: E402
from kernels.fused_moe import fused_moe, moe_kernel_variant  # noqa: E402

# float32: equal up to summation order.
ATOL_FP32 = 1e-4

COMMON = dict(vocab_size=49152, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**COMMON, intermediate_size=96, tie_word_embeddings=True,
                                              rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                            "original_max_position_embeddings": 64}),
    "mixtral": lambda: transformers.MixtralConfig(**COMMON, intermediate_size=96, num_local_experts=4,
                                                  num_experts_per_tok=2),
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(**COMMON, intermediate_size=96, moe_intermediate_size=32,
                                                     shared_expert_intermediate_size=48, num_experts=4,
                                                     num_experts_per_tok=2, decoder_sparse_step=2),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**COMMON, head_dim=32, moe_intermediate_size=32,
                                                     num_experts=8, num_experts_per_tok=2, norm_topk_prob=True),
    "olmoe": lambda: transformers.OlmoeConfig(**COMMON, intermediate_size=32, num_experts=8,
                                              num_experts_per_tok=2),
}


# the kernels on CPU tensors need Triton's interpreter, which a machine with a GPU does not run: there `cuda` runs them;
# on the CPU these tiny experts run as one dense FFN (`DenseExperts`), and one matmul per expert (`cpu-grouped`) as
# larger experts do
DEVICES = ["cpu", "cpu-grouped"] + (["cuda"] if torch.cuda.is_available() else ["cpu-kernels"])
# the interpreter is slow: the families whose CUDA paths differ (q/k norms and a plain MoE; a shared expert)
INTERPRETED = {"qwen3_moe", "qwen2_moe"}


@contextlib.contextmanager
def kernels_on_cpu(device: str):
    """The model's fused-kernel path on CPU tensors while the `cpu-kernels` engine runs."""
    model_module.KERNELS_ON_CPU = device == "cpu-kernels"
    try:
        yield
    finally:
        model_module.KERNELS_ON_CPU = False


@pytest.fixture(scope="module", params=[(f, d) for f in sorted(CONFIGS) for d in DEVICES
                                        if (d != "cpu-kernels" or f in INTERPRETED)
                                        and (d != "cpu-grouped" or f != "llama")], ids="-".join)
def checkpoint(request, tmp_path_factory):
    family, device = request.param
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(CONFIGS[family]()).eval()
    with torch.no_grad():  # random init is tiny; widen it so routing and attention are not trivial
        for name, p in ref.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.2)
    folder = tmp_path_factory.mktemp(family)
    ref.save_pretrained(folder)
    kernels = "triton" if device == "cpu-kernels" else "auto"
    dense_max = 0 if device == "cpu-grouped" else model_module.DENSE_EXPERT_MAX_WEIGHTS
    with kernels_on_cpu(device), mock.patch.object(model_module, "DENSE_EXPERT_MAX_WEIGHTS", dense_max):
        engine = LLMEngine(EngineArgs(model=str(folder), tokenizer="none", kv_format="full",
                                      device=device.split("-")[0], dtype="float32", attention_backend=kernels))
    assert (engine.cache.decode_kernel is not None) == (device in ("cuda", "cpu-kernels"))
    moes = [layer.mlp for layer in engine.model.layers if isinstance(layer.mlp, model_module.MoE)]
    assert all((m.dense is not None) == (device == "cpu") for m in moes)
    return family, device, ref, engine


@pytest.mark.parametrize("chunk_size", [40, 150])
def test_logits_match_transformers(checkpoint, chunk_size):
    """In chunks of 40 rows, and of 150 (on the kernel path its GEMMs padded to 192 rows, `model.Linear`)."""
    family, device, ref, engine = checkpoint
    ids = torch.randint(0, 49152, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    with kernels_on_cpu(device):
        ours = engine.score(ids, chunk_size=chunk_size).cpu()
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, expected, atol=ATOL_FP32, rtol=1e-4)


def test_greedy_equals_transformers_generate(checkpoint):
    family, device, ref, engine = checkpoint
    prompts = [torch.randint(0, 49152, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 17, 33)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    rids = [engine.add_request(None, SamplingParams(**vars(params)), prompt_ids=p) for p in prompts]
    done = {}
    if engine.moe_layers:
        engine.reset_routing_counts()
    with kernels_on_cpu(device):
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out.token_ids
    for rid, p in zip(rids, prompts):
        with torch.no_grad():
            expected = ref.generate(torch.tensor([p]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                    pad_token_id=0)
        assert done[rid] == expected[0, len(p):].tolist(), family
    if engine.moe_layers:  # every token fed (prompts, and each answer but its last token) routed to top_k experts
        fed = sum(map(len, prompts)) + len(prompts) * (params.max_tokens - 1)
        counts = engine.routing_counts()
        assert counts.sum(1).tolist() == [fed * engine.cfg.num_experts_per_tok] * len(counts)


def test_kernel_warm_up_runs_every_moe_variant_and_changes_nothing(checkpoint):
    """`Transformer.warm_up_kernels` (the engine's start-up on CUDA): on the kernel path the fused MoE runs once in each
    variant a prompt of up to `max_rows` rows (80 here) would compile (`moe_kernel_variant`), and afterwards the logits
    and the routing counts are what they were; off the kernel path nothing runs."""
    from kernels import fused_moe as fused_moe_module
    family, device, ref, engine = checkpoint
    ids = torch.randint(0, 49152, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    with kernels_on_cpu(device):
        before = engine.score(ids, chunk_size=30)
        counts = engine.routing_counts() if engine.moe_layers else None
        calls = []
        with mock.patch.object(fused_moe_module, "fused_moe",
                               side_effect=lambda x, *a, **k: calls.append(x.shape[0]) or fused_moe(x, *a, **k)):
            engine.model.warm_up_kernels(80)
        if counts is not None:
            assert torch.equal(engine.routing_counts(), counts)
        assert torch.equal(engine.score(ids, chunk_size=30), before)
    moe = next((m for m in engine.moe_layers if m.dense is None), None)
    if device in ("cuda", "cpu-kernels") and moe is not None:
        E, k = moe.gate.out_features, moe.top_k
        assert {moe_kernel_variant(T * k, E) for T in calls} == {moe_kernel_variant(T * k, E) for T in range(1, 81)}
        assert len(calls) == len(set(calls)) > 1
    else:
        assert not calls


def test_values_rotated_into_the_cache_leave_the_logits(checkpoint):
    """`rotate_values`: a Hadamard folded into the value and output projections; the cache stores V R (what a
    low-bit value code reads better) and the model's logits stay transformers' (float32: equal up to rounding)."""
    family, device, ref, engine = checkpoint
    attn = engine.model.layers[0].self_attn
    dev = attn.qkv_proj.weight.device
    x = torch.randn(3, engine.cfg.hidden_size, generator=torch.Generator().manual_seed(2)).to(dev)
    values = lambda: attn.qkv_proj(x)[:, -attn.num_kv_heads * attn.head_dim:].view(3, attn.num_kv_heads, -1)  # noqa: E731
    plain, weights = values(), [p.clone() for p in engine.model.parameters()]
    ids = torch.randint(0, 49152, (90,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0]
    kv_format, budget = engine.args.kv_format, engine.args.kv_budget_bytes
    engine.reset_cache(kv_format, {"rotate_values": True}, budget, engine.args.max_num_seqs)
    try:
        rotation = engine.cache.value_rotation.to(dev)
        torch.testing.assert_close(values(), plain @ rotation, atol=1e-5, rtol=1e-5)
        with kernels_on_cpu(device):
            torch.testing.assert_close(engine.score(ids, chunk_size=40).cpu(), expected, atol=ATOL_FP32, rtol=1e-4)
    finally:
        engine.reset_cache(kv_format, {}, budget, engine.args.max_num_seqs)
    for p, before in zip(engine.model.parameters(), weights):  # undone
        torch.testing.assert_close(p, before, atol=1e-6, rtol=1e-6)
