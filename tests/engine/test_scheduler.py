"""Stall-free batching: every running decode is in every step, prompts progress in chunks within the
token budget (and within `max_step_ms` when set), and mixing prompts in does not change greedy tokens."""
import json
import math

import pytest
import torch

from backend.engine import EngineArgs, LLMEngine
from backend.sampling import SamplingParams
from backend.step_cost import FORGET_AFTER, StepCost

CHAT = "The capital of France is"
DOCUMENT = " ".join(["The history of the city goes back to a small settlement on the river bank."] * 40)


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(EngineArgs(model="default", kv_format="full", max_num_seqs=4, max_num_batched_tokens=64))


def greedy(n):
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def run_checking_plans(engine, arrivals, budget=None, layered=None, abort=None):
    """arrivals: {step: [(request_id, prompt, max_tokens)]}. Steps the engine, checking each step's plan;
    returns {request_id: token_ids}. `layered`: a list that takes each step's layered chunk (request id, tokens,
    first layer, last layer, decodes beside it) or None; `abort`: {step: request_id} cancelled before that step."""
    outputs, step = {}, 0
    while engine.has_unfinished() or any(s >= step for s in arrivals):
        for rid, prompt, n in arrivals.get(step, []):
            engine.add_request(prompt, greedy(n), request_id=rid)
        if abort and step in abort:
            engine.abort(abort[step])
        decoding = [s for s in engine.running if s.num_pending == 1]
        for out in engine.step():
            outputs[out.request_id] = out.token_ids
        planned = {s.request_id: n for s, n in engine.plan}
        assert all(s.request_id in planned for s in decoding), f"step {step}: a decode waited for a prompt"
        assert sum(planned.values()) <= engine.args.max_num_batched_tokens
        prefill = sum(n for s, n in engine.plan if s not in decoding)
        if budget is not None and decoding:
            assert prefill <= budget, f"step {step}: {prefill} prompt tokens beside decodes"
        if layered is not None:
            plan = engine.layered_plan
            layered.append(None if plan is None else
                           ([(s.request_id, n) for s, n in plan[0]], plan[1], plan[2], len(decoding)))
            assert plan is None or prefill == 0, f"step {step}: another prompt beside layered chunks"
        step += 1
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks
    return outputs


def test_decodes_never_wait_and_tokens_do_not_change(engine):
    alone = run_checking_plans(engine, {0: [("chat", CHAT, 24)]})
    # two long documents arrive while the chat decodes: each takes several 64-token steps
    mixed = run_checking_plans(engine, {0: [("chat", CHAT, 24)], 3: [("doc1", DOCUMENT, 4)],
                                        5: [("doc2", DOCUMENT, 4)]})
    assert mixed["chat"] == alone["chat"]
    assert len(mixed["doc1"]) == len(mixed["doc2"]) == 4


@pytest.mark.parametrize("kv_format", ["full", "alrkvd-cpu"])
def test_layered_prefill_a_group_of_layers_a_step_the_same_tokens(kv_format):
    """`layered_prefill=4`: a document arriving beside a decoding chat goes through SmolLM2's 30 layers in groups of
    8, 8, 8 and 6, a group a step, in chunks of up to 512 tokens, the chat's decode in every step and no other prompt
    beside; the same greedy tokens as without layering (whole chunks beside the decode). Each step's group of layers
    goes on the device before any of the step's tokens is read (the device runs it while the host takes them)."""
    args = dict(model="default", kv_format=kv_format, max_num_seqs=4, max_num_batched_tokens=512)
    arrivals = {0: [("chat", CHAT, 20)], 2: [("doc", DOCUMENT, 4)]}
    plain = run_checking_plans(LLMEngine(EngineArgs(**args)), arrivals)
    steps, engine = [], LLMEngine(EngineArgs(**args, layered_prefill=4))
    calls, step, run_layers, take = [], engine.step, engine._run_layers, engine._take
    engine.step = lambda: calls.append([]) or step()
    engine._run_layers = lambda decodes: calls[-1].append("layers") or run_layers(decodes)
    engine._take = lambda pending: calls[-1].append("take") or take(pending)
    assert run_checking_plans(engine, arrivals, layered=steps) == plain
    doc = len(engine.tokenize(DOCUMENT))
    groups = [(0, 8, 1), (8, 16, 1), (16, 24, 1), (24, 30, 1)]  # consecutive steps, from the document's arrival
    assert steps[2:10] == [([("doc", 512)], *g) for g in groups] + [([("doc", doc - 512)], *g) for g in groups]
    layered = [c for c in calls if "layers" in c]
    assert len(layered) == 8 and all(c[0] == "layers" and "take" in c for c in layered), layered


QWEN3_MOE = dict(model_type="qwen3_moe", vocab_size=512, hidden_size=128, num_hidden_layers=6, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, intermediate_size=256, moe_intermediate_size=64, num_experts=8,
                 num_experts_per_tok=2, norm_topk_prob=True, rms_norm_eps=1e-6, rope_theta=1e6,
                 max_position_embeddings=1024, tie_word_embeddings=False)


def moe_engine(tmp_path, **args) -> LLMEngine:
    """An engine over a dummy MoE of QWEN3_MOE's shape, fp32 on the CPU, fp16 KV."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_MOE))
    return LLMEngine(EngineArgs(model=str(tmp_path), load_format="dummy", tokenizer="none", dtype="float32",
                                **{"kv_format": "fp16", "max_num_seqs": 4, "max_num_batched_tokens": 256, **args}))


def test_layered_chunks_of_several_prompts_one_cancelled_midway(tmp_path):
    """A MoE (dummy Qwen3 shape, 6 layers, groups of 2): two prompts arriving together go through the layers in one
    batch; one is cancelled after the first group. The other's tokens are those of a run without layering (where
    both prompts ran whole beside the decode, then one was cancelled), and every block comes back."""
    g = torch.Generator().manual_seed(0)
    chat, first, second = (torch.randint(0, 512, (n,), generator=g).tolist() for n in (20, 44, 84))
    outputs = []
    for groups in (0, 3):
        engine = moe_engine(tmp_path, layered_prefill=groups)
        engine.add_request(None, greedy(10), request_id="chat", prompt_ids=chat)
        out, steps = {}, []
        for step in range(12):
            if step == 2:
                engine.add_request(None, greedy(3), request_id="first", prompt_ids=first)
                engine.add_request(None, greedy(3), request_id="second", prompt_ids=second)
            if step == 3:
                engine.abort("first")
            out.update((o.request_id, o.token_ids) for o in engine.step())
            plan = engine.layered_plan
            steps.append(plan and ([(s.request_id, n) for s, n in plan[0]], plan[1], plan[2]))
        assert not engine.has_unfinished() and engine.cache.allocator.num_free == engine.cache.allocator.num_blocks
        outputs.append(out)
    assert steps[2:5] == [([("first", 44), ("second", 84)], 0, 2), ([("second", 84)], 2, 4), ([("second", 84)], 4, 6)]
    assert outputs[1]["second"] == outputs[0]["second"] and outputs[1]["chat"] == outputs[0]["chat"]


def test_layering_only_beside_decodes_that_read_under_half_the_experts(tmp_path):
    """With 2 of 8 experts a token, a decode step of 3 tokens reads over half the experts (1 - (6/8)^3 = 58%) that a
    prompt's step reads: beside 3 decodes a prompt's chunk goes whole into the step, beside 2 through the layers."""
    g = torch.Generator().manual_seed(0)
    chats, prompt = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (12, 14, 16)], list(range(40))
    for decoding, layered in ((3, False), (2, True)):
        engine = moe_engine(tmp_path, layered_prefill=3)
        assert engine.layering_max_decodes == 2
        for i in range(decoding):
            engine.add_request(None, greedy(8), request_id=f"chat{i}", prompt_ids=chats[i])
        engine.step()  # the chats' prompts, then they decode
        engine.add_request(None, greedy(2), request_id="doc", prompt_ids=prompt)
        engine.step()
        whole = [n for s, n in engine.plan if s.request_id == "doc"]
        assert (engine.layered_plan is not None, whole) == ((True, []) if layered else (False, [40]))


def test_layered_chunks_start_after_a_cached_prefix(tmp_path):
    """With prefix caching, a follow-up whose first blocks an earlier request filled goes through the layers from
    where its cached blocks end: the same tokens and the same cache hits as without layering."""
    g = torch.Generator().manual_seed(1)
    chat, history, turn = (torch.randint(0, 512, (n,), generator=g).tolist() for n in (20, 100, 30))
    outputs = []
    for groups in (0, 3):
        engine = moe_engine(tmp_path, enable_prefix_caching=True, layered_prefill=groups)
        engine.add_request(None, greedy(24), request_id="chat", prompt_ids=chat)
        out, chunks = {}, []
        for step in range(30):
            if step == 1:
                engine.add_request(None, greedy(2), request_id="first", prompt_ids=history)
            if step == 8:  # "first" is done: its blocks are cached
                engine.add_request(None, greedy(4), request_id="again", prompt_ids=history + turn)
            out.update((o.request_id, o.token_ids) for o in engine.step())
            if engine.layered_plan:
                chunks += [(s.request_id, s.kv.num_tokens, n) for s, n in engine.layered_plan[0]]
        assert not engine.has_unfinished() and engine.cache.allocator.num_free == engine.cache.allocator.num_blocks
        outputs.append((out, engine.prefix_cache_hit_tokens))
    block = engine.cache.block_size
    assert outputs[1] == outputs[0] and outputs[1][1] == 100 // block * block
    assert ("again", 100 // block * block, 130 - 100 // block * block) in chunks  # (its first group's row)


@pytest.mark.parametrize("args, match", [({"layered_prefill": -1}, "number of layer groups"),
                                         ({"layered_prefill": 4, "expert_budget_bytes": 1 << 20}, "streamed experts")])
def test_layered_prefill_refuses_what_it_cannot_do(tmp_path, args, match):
    with pytest.raises(ValueError, match=match):
        moe_engine(tmp_path, **args)


def test_step_target_keeps_chunks_small_beside_decodes():
    """A target below what any prompt token costs leaves prompts the minimal chunk while decodes run,
    and they still finish."""
    engine = LLMEngine(EngineArgs(model="default", kv_format="full", max_num_seqs=4, max_num_batched_tokens=256,
                                  max_step_ms=1e-3))
    out = run_checking_plans(engine, {0: [("chat", CHAT, 30)], 2: [("doc", DOCUMENT, 3)]},
                             budget=engine.step_cost.min_chunk)
    assert len(out["doc"]) == 3 and len(out["chat"]) == 30
    assert engine.step_cost.estimate_ms(1) > 0


def test_step_cost_budget():
    cost = StepCost(target_ms=50, min_chunk=16)
    assert cost.prefill_budget(num_decode=0, max_tokens=512) == 512   # nobody streams: take the room
    assert cost.prefill_budget(num_decode=4, max_tokens=512) == 16    # nothing measured: minimal chunk
    cost.observe(num_tokens=4, ms=10.0)
    cost.observe(num_tokens=104, ms=30.0)
    # past the largest step measured, along the chord from the smallest: 30 + 0.2 (T - 104) <= 50 up to T = 204
    assert cost.prefill_budget(num_decode=4, max_tokens=512) == 200
    assert cost.prefill_budget(num_decode=4, max_tokens=100) == 96    # the step's token budget still holds
    for _ in range(40):                                               # decodes alone now past the target
        cost.observe(num_tokens=4, ms=60.0)
    assert cost.prefill_budget(num_decode=4, max_tokens=512) == 16    # prompts still progress


def test_step_cost_budget_relative_to_the_decode_step():
    cost = StepCost(target_ratio=2.0, min_chunk=16)
    cost.observe(num_tokens=104, ms=20.0)                             # below it, a decode step is not overstated
    assert cost.prefill_budget(num_decode=4, max_tokens=512) == 16    # (20 x 4 / 104 ms): a minimal chunk
    cost.observe(num_tokens=4, ms=10.0)
    assert cost.prefill_budget(num_decode=4, max_tokens=512) == 100   # 2 x 10 ms is the 104-token step
    for _ in range(40):                                               # a larger batch: decode steps of 40 ms
        cost.observe(num_tokens=32, ms=40.0)
    # the 104-token step never costs less than the 32-token one; from (4, 10) to (104, 40) the chord rises
    # 0.3 ms a token: 40 + 0.3 (T - 104) <= 80 up to T = 237
    assert cost.prefill_budget(num_decode=32, max_tokens=512) == 205
    cost.target_ms = 50.0                                             # with both targets, the smaller
    assert cost.prefill_budget(num_decode=32, max_tokens=512) == 105  # 40 + 0.3 (T - 104) <= 50: T <= 137


def h200_step_ms(tokens):
    """A concave step-time curve shaped like the H200's Qwen3-30B-A3B steps (decode at 1 / 8 / 32: ~6 / 13 /
    25 ms; 256 tokens ~37 ms): the experts' weights are read once whatever the tokens."""
    return 5 + 27 * (1 - math.exp(-tokens / 25)) + 0.02 * tokens


@pytest.mark.parametrize("ratio", [1.5, 2.0])
def test_step_cost_follows_the_batch_on_a_concave_curve(ratio):
    """Starting from nothing, with the batch moving between 8 and 32 decodes, the budget settles where a mixed
    step lasts the ratio times the decode step of the batch it runs beside, and overshoots it by little (or
    takes the minimal chunk, when even that one overshoots)."""
    cost = StepCost(target_ratio=ratio)
    for num_decode in (8, 32, 8, 32):
        target = ratio * h200_step_ms(num_decode)
        best = max(n for n in range(2048) if h200_step_ms(num_decode + n) <= target)
        for _ in range(30):
            cost.observe(num_decode, h200_step_ms(num_decode))         # a decode-only step
            n = cost.prefill_budget(num_decode, max_tokens=2048)
            assert n == cost.min_chunk or h200_step_ms(num_decode + n) <= 1.05 * target
            cost.observe(num_decode + n, h200_step_ms(num_decode + n))  # the mixed step
        assert n >= 0.8 * best, (num_decode, n, best)


@pytest.mark.parametrize("stalled", [0, 3])
def test_step_cost_heals_from_a_stalled_step(stalled):
    """One step that carries a prompt beside decodes stalls (a kernel compiled on first use: 50 times its cost):
    the first such step, or a later one of a size not measured before. The budget comes back within
    FORGET_AFTER steps. Before, that size and all larger ones were out of reach for good: no step that size ran
    again to correct it (the first stalled: prompts progressed by the minimal chunk)."""
    cost = StepCost(target_ms=60.0)
    num_decode = 8
    best = max(n for n in range(2048) if h200_step_ms(num_decode + n) <= 60.0)
    for _ in range(30):
        cost.observe(num_decode, h200_step_ms(num_decode))  # decodes alone, until a prompt arrives
    for step in range(FORGET_AFTER + 30):
        n = cost.prefill_budget(num_decode, max_tokens=2048)
        cost.observe(num_decode + n, h200_step_ms(num_decode + n) * (50 if step == stalled else 1))
        cost.observe(num_decode, h200_step_ms(num_decode))
    assert n >= 0.9 * best, (n, best)


def test_step_cost_ignores_its_warmup_steps():
    cost = StepCost(target_ms=50, warmup_steps=2)
    cost.observe(num_tokens=4, ms=5000.0)  # (the first steps compile kernels)
    cost.observe(num_tokens=104, ms=5000.0)
    assert cost.estimate_ms(4) is None
    cost.observe(num_tokens=4, ms=10.0)
    assert cost.estimate_ms(4) == 10.0


def test_short_prompts_go_first_under_a_step_target():
    """With `max_step_ms`, a chat arriving while a document's prompt is being chunked is prefilled first:
    its first token comes before the document's."""
    engine = LLMEngine(EngineArgs(model="default", kv_format="full", max_num_seqs=4, max_num_batched_tokens=256,
                                  max_step_ms=1e-3))
    first = {}
    engine.add_request(DOCUMENT, greedy(2), request_id="doc")
    for step in range(200):
        if step == 1:  # the document took the whole first step: nobody was streaming
            engine.add_request(CHAT, greedy(2), request_id="chat")
        for out in engine.step():
            first.setdefault(out.request_id, step)
        if not engine.has_unfinished():
            break
    assert first["chat"] < first["doc"]
