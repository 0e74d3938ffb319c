"""Stall-free batching: every running decode is in every step, prompts progress in chunks within the
token budget (and within `max_step_ms` when set), and mixing prompts in does not change greedy tokens."""
import math

import pytest

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


def run_checking_plans(engine, arrivals, budget=None):
    """arrivals: {step: [(request_id, prompt, max_tokens)]}. Steps the engine, checking each step's plan;
    returns {request_id: token_ids}."""
    outputs, step = {}, 0
    while engine.has_unfinished() or any(s >= step for s in arrivals):
        for rid, prompt, n in arrivals.get(step, []):
            engine.add_request(prompt, greedy(n), request_id=rid)
        decoding = [s for s in engine.running if s.num_pending == 1]
        for out in engine.step():
            outputs[out.request_id] = out.token_ids
        planned = {s.request_id: n for s, n in engine.plan}
        assert all(s.request_id in planned for s in decoding), f"step {step}: a decode waited for a prompt"
        assert sum(planned.values()) <= engine.args.max_num_batched_tokens
        prefill = sum(n for s, n in engine.plan if s not in decoding)
        if budget is not None and decoding:
            assert prefill <= budget, f"step {step}: {prefill} prompt tokens beside decodes"
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
