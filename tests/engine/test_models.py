"""Every supported family against transformers on tiny random checkpoints written by the test; on CUDA also the
engine on the GPU (in float32), where its Triton kernels (norms, RoPE, MoE, paged attention) replace PyTorch."""
import pytest
import torch
import transformers

from backend.engine import EngineArgs, LLMEngine
from backend.sampling import SamplingParams

# float32: equal up to summation order.
ATOL_FP32 = 1e-4

COMMON = dict(vocab_size=49152, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
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


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module", params=[(f, d) for f in sorted(CONFIGS) for d in DEVICES], ids="-".join)
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
    engine = LLMEngine(EngineArgs(model=str(folder), tokenizer="none", kv_format="full", device=device,
                                  dtype="float32"))
    return family, ref, engine


def test_logits_match_transformers(checkpoint):
    family, ref, engine = checkpoint
    ids = torch.randint(0, 49152, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    ours = engine.score(ids, chunk_size=40).cpu()
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, expected, atol=ATOL_FP32, rtol=1e-4)


def test_greedy_equals_transformers_generate(checkpoint):
    family, ref, engine = checkpoint
    prompts = [torch.randint(0, 49152, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 17, 33)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    rids = [engine.add_request(None, SamplingParams(**vars(params)), prompt_ids=p) for p in prompts]
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    for rid, p in zip(rids, prompts):
        with torch.no_grad():
            expected = ref.generate(torch.tensor([p]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                    pad_token_id=0)
        assert done[rid] == expected[0, len(p):].tolist(), family
