"""The engine against transformers (the reference implementation) and its serving behaviour."""
from kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()  # before Triton kernels load: the glue tests run them interpreted on CPU

import os  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from backend.engine import EngineArgs, LLMEngine  # noqa: E402
from backend.tokenizer import default_model_path  # noqa: E402
from backend.sampling import SamplingParams  # noqa: E402

# float32 everywhere on CPU: our kernels and transformers' differ only in summation order.
ATOL_FP32 = 2e-3


@pytest.fixture(scope="module")
def smollm():
    return LLMEngine(EngineArgs(model="default", kv_format="full", max_num_seqs=16))


@pytest.fixture(scope="module")
def hf_smollm():
    path = default_model_path()
    return transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()


PROMPTS = [
    "The capital of France is",
    "In 1905, Albert Einstein published four papers that",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]


def logits_and_reference(engine, hf):
    """Our logits (chunked prefill: the odd chunk crosses block borders) and transformers' on one text."""
    ids = engine.tokenizer.encode(" ".join(PROMPTS) * 3)
    ours = engine.score(ids, chunk_size=37)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    assert ours.shape == ref.shape
    return ours, ref


def assert_greedy_equals_transformers_generate(engine, hf):
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs):
        ids = engine.tokenizer.encode(prompt)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=24, min_new_tokens=24, do_sample=False)
        assert out.token_ids == ref[0, len(ids):].tolist(), prompt


def test_smollm_logits_match_transformers(smollm, hf_smollm):
    ours, ref = logits_and_reference(smollm, hf_smollm)
    torch.testing.assert_close(ours, ref, atol=ATOL_FP32, rtol=1e-3)
    assert smollm.cache.allocator.num_free == smollm.cache.allocator.num_blocks


def test_smollm_greedy_equals_transformers_generate(smollm, hf_smollm):
    assert_greedy_equals_transformers_generate(smollm, hf_smollm)


# weight_dtype="float16" rounds every linear weight to fp16 (activations stay fp32): logits move by
# about 4e-3 on average and 0.034 at most (logits up to 40) on this text; we allow 0.1.
ATOL_FP16_WEIGHTS = 0.1


def test_fp16_weights_stay_with_transformers(hf_smollm):
    fast = LLMEngine(EngineArgs(model="default", kv_format="full", weight_dtype="float16", max_num_seqs=4))
    ours, ref = logits_and_reference(fast, hf_smollm)
    torch.testing.assert_close(ours, ref, atol=ATOL_FP16_WEIGHTS, rtol=0)
    assert_greedy_equals_transformers_generate(fast, hf_smollm)


def test_chat_answer(smollm):
    out = smollm.generate([[{"role": "user", "content": "What is the capital of France?"}]],
                          SamplingParams(max_tokens=20, temperature=0))[0]
    assert out.text == "The capital of France is Paris."
    assert out.finish_reason == "stop"


def test_batch_invariance(smollm):
    """A request's greedy output is the same alone and among 8 others of different lengths."""
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    alone = smollm.generate([PROMPTS[1]], params)[0].token_ids
    others = [PROMPTS[i % 4] * (1 + i % 3) for i in range(8)]
    together = smollm.generate(others[:4] + [PROMPTS[1]] + others[4:], params)[4].token_ids
    assert together == alone


def test_stop_strings_and_stop_ids(smollm):
    free = smollm.generate([PROMPTS[0]], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    word = free.text.split()[1]
    out = smollm.generate([PROMPTS[0]], SamplingParams(max_tokens=12, temperature=0, stop=[word]))[0]
    assert out.finish_reason == "stop" and word not in out.text and free.text.startswith(out.text)
    out = smollm.generate([PROMPTS[0]], SamplingParams(max_tokens=12, temperature=0,
                                                       stop_token_ids=[free.token_ids[2]]))[0]
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[:3]


def test_seeded_sampling_is_reproducible(smollm):
    p = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, top_k=50, seed=1234)
    a = smollm.generate([PROMPTS[3]], p)[0].token_ids
    b = smollm.generate([PROMPTS[3], PROMPTS[0]], p)[0].token_ids
    assert a == b


def test_streamed_deltas_join_to_text(smollm):
    rid = smollm.add_request(PROMPTS[3] + " 日本語で🙂", SamplingParams(max_tokens=40, temperature=0.9, seed=7))
    pieces, final = [], None
    while smollm.has_unfinished():
        for out in smollm.step():
            pieces.append(out.text_delta)
            final = out
    assert "".join(pieces) == final.text
    assert final.num_output_tokens == len(final.token_ids) == 40


def test_abort_frees_blocks(smollm):
    cache = smollm.cache
    rid = smollm.add_request(PROMPTS[2] * 10, SamplingParams(max_tokens=100, temperature=0))
    for _ in range(3):
        smollm.step()
    assert cache.allocator.num_free < cache.allocator.num_blocks
    out = smollm.abort(rid)
    assert out.finished and out.finish_reason == "cancelled"
    assert cache.allocator.num_free == cache.allocator.num_blocks
    assert not smollm.has_unfinished()


def test_preemption_recomputes_and_frees(smollm):
    """A cache too small for all sequences: the engine preempts, the outputs do not change."""
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    expected = [o.token_ids for o in smollm.generate(PROMPTS, params)]
    # 8 blocks of 16 tokens (and the scratch block of graph padding): the four sequences need 10 at their longest
    tight = LLMEngine(EngineArgs(kv_format="full", kv_budget_bytes=9 * smollm.cache.block_bytes))
    got = [o.token_ids for o in tight.generate(PROMPTS, params)]
    assert tight.num_preemptions > 0
    assert got == expected
    assert tight.cache.allocator.num_free == tight.cache.allocator.num_blocks


HISTORY = " ".join(PROMPTS) * 6  # a chat's history: the next turn's prompt repeats it
NEXT_TURN = HISTORY + " And then the fisherman said"


@pytest.mark.parametrize("kv_format", ["full", "alrkvd"])
def test_prefix_caching_takes_the_history_blocks(smollm, kv_format):
    """enable_prefix_caching: the next turn takes the blocks the history filled (every whole block of the prompts'
    common tokens; for ALR-KVD its compressed blocks) instead of computing them. With a lossless format its greedy
    tokens are those of an engine without the cache (a lossy one reads those tokens compressed, where an engine
    without the cache reads them exactly inside the next turn's prompt chunk). Afterwards every block is free
    again, the cached ones evictable."""
    from backend.kv_cache import prefix_hash
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    cached = LLMEngine(EngineArgs(kv_format=kv_format, enable_prefix_caching=True))
    first, second = (cached.tokenizer.encode(t) for t in (HISTORY, NEXT_TURN))
    bs, allocator = cached.cache.block_size, cached.cache.allocator
    whole = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), len(first)) // bs
    assert whole > 0
    answers = [cached.generate([HISTORY], params)[0].token_ids]
    key, history_blocks = None, []
    for i in range(whole):
        key = prefix_hash(key, second[i * bs:(i + 1) * bs])
        history_blocks.append(allocator.by_hash[key])
    rid = cached.add_request(NEXT_TURN, params)
    cached.step()
    assert cached.running[0].kv.block_table[:whole] == history_blocks
    while cached.has_unfinished():
        answers += [o.token_ids for o in cached.step() if o.request_id == rid and o.finished]
    assert cached.prefix_cache_hit_tokens == whole * bs
    if kv_format == "full":
        assert answers == [o.token_ids for o in smollm.generate([HISTORY, NEXT_TURN], params)]
    assert smollm.stats()["prefix_cache_hit_tokens"] == 0
    assert allocator.num_free == allocator.num_blocks and not any(allocator.refs)
    assert len(allocator.evictable) == len(allocator.by_hash) > 0


def test_prefix_caching_under_a_tight_cache(smollm):
    """Cached blocks give their room to new ones (least recently released first), and a request that is not
    admitted gives back the cached blocks it took: the same tokens as without the cache, and nothing leaks."""
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = [HISTORY[:200], PROMPTS[3] * 4, HISTORY[:200] + " Yes."]
    expected = [o.token_ids for o in smollm.generate(prompts, params)]
    tight = LLMEngine(EngineArgs(kv_format="full", kv_budget_bytes=12 * smollm.cache.block_bytes, max_num_seqs=1,
                                 enable_prefix_caching=True))
    allocator = tight.cache.allocator
    assert [o.token_ids for o in tight.generate(prompts[:1], params)] == expected[:1]
    history = len(allocator.by_hash)
    ids = [tight.add_request(p, params) for p in prompts[1:]]  # the third waits: one sequence at a time
    tight.step()
    assert allocator.num_free + len(tight.running[0].kv.block_table) == allocator.num_blocks  # it held none
    outs = {}
    while tight.has_unfinished():
        outs.update({o.request_id: o.token_ids for o in tight.step() if o.finished})
    assert [outs[i] for i in ids] == expected[1:]
    # the second evicted the history's last blocks, not its first: the third took what was left of it
    assert 0 < tight.prefix_cache_hit_tokens < history * tight.cache.block_size
    assert allocator.num_free == allocator.num_blocks and not any(allocator.refs)


def test_block_allocator_holds_and_evicts_cached_blocks():
    from backend.kv_cache import BlockAllocator
    a = BlockAllocator(4)
    x, y = a.allocate(2)
    a.cache(x, b"x")
    a.hold(x)  # a second sequence takes it
    a.free([x, y])
    assert a.num_free == 3 and a.refs[x] == 1
    a.free([x])
    assert a.num_free == 4 and list(a.evictable) == [x] and a.by_hash == {b"x": x}
    assert sorted(a.allocate(3)) == sorted(set(range(4)) - {x})  # free blocks before the cached one
    assert a.allocate(1) == [x] and a.by_hash == {} and a.hash_of == {}  # then its room: it leaves the cache
    with pytest.raises(AssertionError, match="freed twice"):
        a.free([y, y])


def test_bad_requests(smollm):
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams.from_dict({"temperature": -1})
    with pytest.raises(ValueError, match="unknown"):
        SamplingParams.from_dict({"max_token": 3})
    with pytest.raises(ValueError, match="at most"):
        smollm.add_request("hi " * 9000, SamplingParams())
    limits = smollm.limits  # what the Triton model validates requests against, once
    assert (limits.max_model_len, limits.max_output_tokens, limits.vocab_size) == (8192, 8191, 49152)
    with pytest.raises(ValueError, match="at most 8191 tokens"):
        SamplingParams.from_dict({"max_tokens": 8192}, limits)
    with pytest.raises(ValueError, match="at most 8191 tokens"):
        smollm.add_request("hi", SamplingParams(max_tokens=8192))
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams.from_dict({"top_k": limits.vocab_size + 1}, limits)


def test_decode_fast_path_glue(smollm):
    """The CUDA decode path (paged kernel over the block tables) gives the same tokens as the batched
    PyTorch path; on CPU the kernel's PyTorch reference stands in for the Triton kernel."""
    from kernels.paged_attention import paged_decode_attention_ref
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    expected = [o.token_ids for o in smollm.generate(PROMPTS, params)]
    smollm.cache.decode_kernel = paged_decode_attention_ref
    try:
        got = [o.token_ids for o in smollm.generate(PROMPTS, params)]
    finally:
        smollm.cache.decode_kernel = None
    assert got == expected


@pytest.mark.parametrize("key_frame", ["post_rope", "rotated"])
def test_alrkvd_decode_kernel_glue(key_frame):
    """The CUDA decode path of ALR-KVD (new tokens into their window slots, a full block compressed,
    the kernel over closed blocks + window) gives the PyTorch path's tokens; on CPU the kernel's
    PyTorch reference stands in for the Triton kernel."""
    from kernels.alrkvd_attention import alrkvd_decode_attention_ref, kernel_options
    from kernels.paged_attention import store_kv
    engine = LLMEngine(EngineArgs(model="default", kv_format="alrkvd", kv_options=kernel_options(64, key_frame=key_frame),
                                  max_num_seqs=4))
    assert engine.cache.kernel_layers is not None and engine.cache.decode_kernel is None  # CPU: PyTorch path
    prompts = [PROMPTS[3] * 6, PROMPTS[1] * 3]
    lengths = [len(engine.tokenizer.encode(p)) for p in prompts]
    assert lengths[0] < 128 < lengths[0] + 20 and lengths[1] < 128  # one decode crosses a block border
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    expected = [o.token_ids for o in engine.generate(prompts, params)]
    engine.cache.decode_kernel = alrkvd_decode_attention_ref
    engine.cache.store_kv = store_kv  # new tokens into their window slots by the kernel (interpreted here)
    # as on CUDA: the block a decode step fills is read from the window, then compressed with the blocks of
    # every layer in one call when the step commits (the compression kernel itself: test_alrkvd_compress_kernel_glue)
    calls = []
    encode = engine.cache.compress
    engine.cache.compress = lambda blocks: (calls.append(sorted({b[0] for b in blocks})), encode(blocks))
    got = [o.token_ids for o in engine.generate(prompts, params)]
    assert got == expected
    assert list(range(engine.cfg.num_layers)) in calls  # one call held the block of all 30 layers
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks


def test_kivi_decode_kernel_glue():
    """The CUDA decode path of KIVI (new tokens into their window slots, the kernel over closed blocks + window,
    a block filled by a decode step quantized at commit) gives the PyTorch path's tokens; on CPU the kernel's
    PyTorch reference stands in for the Triton kernel."""
    from kernels.kivi_attention import kivi_decode_attention_ref
    engine = LLMEngine(EngineArgs(model="default", kv_format="kivi4", max_num_seqs=4))
    assert engine.cache.kernel_layers is not None and engine.cache.decode_kernel is None  # CPU: PyTorch path
    prompts = [PROMPTS[3] * 6, PROMPTS[1] * 3]  # as above: one decode crosses the 128-token block border
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    expected = [o.token_ids for o in engine.generate(prompts, params)]
    engine.cache.decode_kernel = kivi_decode_attention_ref
    got = [o.token_ids for o in engine.generate(prompts, params)]
    assert got == expected
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks


def test_alrkvd_compress_kernel_glue():
    """On CUDA a full ALR-KVD block is compressed by the Triton kernel (kernels/alrkvd_compress.py) instead
    of the format's PyTorch encode; here the same kernel runs under TRITON_INTERPRET=1. Blocks close in a
    prefill (the 73-token prompt's first block of 64) and in a decode (61 + 12 tokens): same greedy tokens."""
    from kernels.alrkvd_attention import kernel_options
    engine = LLMEngine(EngineArgs(model="default", kv_format="alrkvd", kv_options=kernel_options(64, block_size=64),
                                  max_num_seqs=4))
    assert engine.cache.compress == engine.cache._encode_blocks  # CPU: the format's PyTorch encode
    prompts = ["The quick brown fox jumps over the lazy dog. " * 6,
               "A journey of a thousand miles begins with a single step. " * 6]
    assert [len(engine.tokenizer.encode(p)) for p in prompts] == [61, 73]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    expected = [o.token_ids for o in engine.generate(prompts, params)]
    engine.cache.compress = engine.cache._compress_kernel
    got = [o.token_ids for o in engine.generate(prompts, params)]
    assert got == expected
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks
