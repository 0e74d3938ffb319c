"""Decode steps as CUDA graphs (backend/cuda_graphs.py) give the tokens of eager decode steps, for every
format with a decode kernel, while the batch shrinks and decodes fill blocks. On CUDA the graphs are
captured and replayed; on CPU the kernels' PyTorch references stand in for the kernels and the graph
runner drives the same static buffers without capturing (everything but the capture itself)."""
from kernels.testing import use_interpreter_without_gpu

DEVICE = use_interpreter_without_gpu()

import json  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from backend.cuda_graphs import DecodeGraphs  # noqa: E402
from backend.engine import EngineArgs, LLMEngine  # noqa: E402
from backend.sampling import SamplingParams  # noqa: E402
from kernels.alrkvd_attention import alrkvd_decode_attention_ref, kernel_options  # noqa: E402
from kernels.kivi_attention import kivi_decode_attention_ref  # noqa: E402
from kernels.paged_attention import paged_decode_attention_ref  # noqa: E402

LLAMA = dict(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
             max_position_embeddings=1024, tie_word_embeddings=True)
QWEN3_MOE = dict(model_type="qwen3_moe", vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, intermediate_size=256, moe_intermediate_size=64, num_experts=8,
                 num_experts_per_tok=2, norm_topk_prob=True, rms_norm_eps=1e-6, rope_theta=1e6,
                 max_position_embeddings=1024, tie_word_embeddings=False)
REFERENCES = {"fp16": paged_decode_attention_ref, "alrkvd": alrkvd_decode_attention_ref,
              "kivi4": kivi_decode_attention_ref}


def engine_for(tmp_path, shape: dict, kv_format: str) -> LLMEngine:
    (tmp_path / "config.json").write_text(json.dumps(shape))
    options = kernel_options(64, block_size=32) if kv_format == "alrkvd" else {}
    engine = LLMEngine(EngineArgs(model=str(tmp_path), load_format="dummy", tokenizer="none", device=DEVICE,
                                  dtype="float32", kv_format=kv_format, kv_options=options, max_num_seqs=4,
                                  enforce_eager=True))
    if DEVICE == "cpu":
        engine.cache.decode_kernel = REFERENCES[kv_format]
    assert engine.graphs is None and engine.cache.decode_kernel is not None
    return engine


@pytest.mark.parametrize("shape", [LLAMA, QWEN3_MOE], ids=["llama", "qwen3_moe"])
@pytest.mark.parametrize("kv_format", ["fp16", "alrkvd", "kivi4"])
def test_graphs_give_the_eager_tokens(tmp_path, shape, kv_format):
    engine = engine_for(tmp_path, shape, kv_format)
    block = engine.cache.block_size
    g = torch.Generator().manual_seed(0)
    # three sequences that finish at different steps (batch sizes 3, 2, 1), decodes that fill blocks
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (block - 5, 2 * block - 3, 40)]
    steps = [block + 8, 12, 20]

    def generate():
        rids = [engine.add_request(None, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True), prompt_ids=p)
                for p, n in zip(prompts, steps)]
        done = {}
        while engine.has_unfinished():
            done |= {o.request_id: o.token_ids for o in engine.step() if o.finished}
        return [done[r] for r in rids]

    engine.reset_routing_counts()
    expected = generate()
    eager_counts = engine.routing_counts()  # tokens routed to each expert (MoE; None for llama)
    engine.graphs = DecodeGraphs(engine.model, engine.cache, 4, engine.max_model_len, capture=DEVICE == "cuda")
    assert generate() == expected
    assert sorted(engine.graphs.graphs) == [1, 2, 3]  # captured on first use
    assert all((g is not None) == (DEVICE == "cuda") for g in engine.graphs.graphs.values())
    # captured up front (the server's start-up), with throwaway sequences that leave nothing behind
    engine.graphs = DecodeGraphs(engine.model, engine.cache, 4, engine.max_model_len, capture=DEVICE == "cuda")
    engine.graphs.capture_all()
    assert sorted(engine.graphs.graphs) == [1, 2, 3, 4]
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks
    engine.reset_routing_counts()
    assert generate() == expected
    if eager_counts is not None:  # graph replays count routed tokens (alrkvd:moe_expert_load_imbalance) as eager steps do
        assert eager_counts.sum() > 0 and torch.equal(engine.routing_counts(), eager_counts)
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks


def test_capture_all_stops_at_what_the_cache_holds(tmp_path):
    """Start-up capture with fewer free blocks than `max_num_seqs`: the sizes that fit, and no error."""
    engine = engine_for(tmp_path, LLAMA, "fp16")
    held = engine.cache.allocator.allocate(engine.cache.allocator.num_free - 2)  # two blocks left
    graphs = DecodeGraphs(engine.model, engine.cache, 4, engine.max_model_len, capture=DEVICE == "cuda")
    graphs.capture_all()
    assert sorted(graphs.graphs) == [1, 2]
    engine.cache.allocator.free(held)
