"""`async_scheduling`: while every running sequence decodes, the next step is queued with the tokens the last one
drew on the device before the host reads them. The tokens are those of the step-by-step engine, whatever stops,
arrives or is cancelled meanwhile, and nothing is leaked."""
import asyncio

import pytest

import backend.engine
from backend.engine import AsyncEngine, EngineArgs, LLMEngine
from backend.sampling import SamplingParams

PROMPTS = ["The capital of France is", "In 1905, Albert Einstein published four papers that",
           "def fibonacci(n):\n    ", "Once upon a time, in a small village by the sea, there lived"]


@pytest.fixture(scope="module", params=["fp16", "alrkvd-cpu"])
def engine(request):
    # blocks of 16 (fp16) and 64 (ALR-KVD, compressed as they close: a step that closes one is not queued ahead)
    return LLMEngine(EngineArgs(model="default", kv_format=request.param, max_num_seqs=4, enable_prefix_caching=True))


def run(engine, arrivals, asynchronous, abort=None):
    """arrivals: {step: [(request_id, prompt, params)]}; abort: {step: request_id} cancelled before that step.
    Returns ({request_id: (token_ids, finish_reason)}, steps that found a step queued ahead)."""
    engine.args.async_scheduling = asynchronous
    final, step, ahead = {}, 0, 0
    while engine.has_unfinished() or any(s >= step for s in arrivals):
        for rid, prompt, params in arrivals.get(step, []):
            engine.add_request(prompt, params, request_id=rid)
        if abort and step in abort:
            out = engine.abort(abort[step])
            if out is not None:
                final[out.request_id] = (out.token_ids, out.finish_reason)
        ahead += engine.pending is not None
        for out in engine.step():
            if out.finished:
                final[out.request_id] = (out.token_ids, out.finish_reason)
        if engine.pending is not None and engine.cache.format.encode_waits_on_host:  # its KV committed: its last token
            assert all(seq.kv.num_tokens % engine.cache.block_size for seq in engine.pending.seqs), \
                "a queued step closes a block whose compression waits on the host (and so for the step behind)"
        step += 1
    assert engine.pending is None
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks
    return final, ahead


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, temperature=0, **{"ignore_eos": True, **kw})


def test_queued_steps_give_the_step_by_step_tokens_through_stops_and_arrivals(engine):
    reference, _ = run(engine, {0: [("a", PROMPTS[0], greedy(20))]}, asynchronous=False)
    stop_token = reference["a"][0][7]  # a token the greedy answer takes at its 8th step
    arrivals = {0: [("a", PROMPTS[0], greedy(20)), ("b", PROMPTS[1], greedy(12))],
                4: [("c", PROMPTS[2], greedy(16, stop_token_ids=[stop_token]))],
                9: [("d", PROMPTS[0], greedy(20)),  # the prompt of "a" again: its blocks from the prefix cache
                    ("e", PROMPTS[3], SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=3))]}
    arrivals[0].append(("s", PROMPTS[3], greedy(24, stop_token_ids=[stop_token])))
    sync, ahead_sync = run(engine, arrivals, asynchronous=False)
    queued, ahead = run(engine, arrivals, asynchronous=True)
    assert queued == sync
    assert ahead_sync == 0 and ahead >= 10  # the steps between arrivals went ahead
    assert queued["d"] == queued["a"]


def test_a_request_cancelled_while_its_step_is_queued_frees_its_blocks(engine):
    arrivals = {0: [("a", PROMPTS[0], greedy(16)), ("b", PROMPTS[1], greedy(16))]}
    sync, _ = run(engine, arrivals, asynchronous=False, abort={6: "a"})
    queued, ahead = run(engine, arrivals, asynchronous=True, abort={6: "a"})
    assert queued == sync and queued["a"][1] == "cancelled" and ahead > 0


def test_each_step_signals_its_launch_before_it_waits_for_tokens(engine, monkeypatch):
    """`on_launch` (where `overlap_outputs` hands the last step's outputs to their streams) runs in every step before
    its tokens are read, a queued step that queues nothing behind it (a prompt arrived) included: else the outputs it
    hands over would wait for that step too (inter-token gaps of two steps, then none, wherever prompts arrive)."""
    events = []
    monkeypatch.setattr(engine, "on_launch", lambda: events.append("launch"))
    read = backend.engine.read_tokens
    monkeypatch.setattr(backend.engine, "read_tokens", lambda tokens: (events.append("read"), read(tokens))[1])
    engine.args.async_scheduling = True
    arrivals = {0: [("a", PROMPTS[0], greedy(12))], 5: [("b", PROMPTS[1], greedy(4))]}
    step, ahead_then_prompt = 0, 0
    while engine.has_unfinished() or step in (0, 5):
        for rid, prompt, params in arrivals.get(step, []):
            engine.add_request(prompt, params, request_id=rid)
        ahead_then_prompt += engine.pending is not None and bool(engine.waiting)
        events.clear()
        engine.step()
        if "read" in events:
            assert "launch" in events and events.index("launch") < events.index("read"), (step, events)
        step += 1
    assert ahead_then_prompt == 1  # the case in question came once


@pytest.mark.parametrize("asynchronous, prompt", [(False, PROMPTS[1]), (True, PROMPTS[2])])
def test_blocks_filled_by_decoding_serve_the_next_turn_from_the_prefix_cache(engine, asynchronous, prompt):
    """A chat's next turn repeats its answer: the blocks the answer filled (in queued steps) are found by their
    tokens. (Each arm its own prompt, so that neither finds the other's blocks.)"""
    first, _ = run(engine, {0: [("turn1", prompt, greedy(100))]}, asynchronous)
    turn = engine.tokenize(prompt) + first["turn1"][0] + engine.tokenize(" And then")
    before = engine.prefix_cache_hit_tokens
    engine.args.async_scheduling = asynchronous
    engine.add_request(None, greedy(2), request_id="turn2", prompt_ids=turn)
    while engine.has_unfinished():
        engine.step()
    bs = engine.cache.block_size
    cached = len(engine.tokenize(prompt)) + 100 - 1  # the first turn's KV: all but its last token
    assert engine.prefix_cache_hit_tokens - before == min(cached // bs, (len(turn) - 1) // bs) * bs


def test_served_streams_give_the_offline_text_and_a_cut_stream_frees_its_blocks():
    reference = {p: out.text for p, out in zip(PROMPTS, LLMEngine(EngineArgs(model="default", kv_format="fp16"))
                                                .generate(PROMPTS, greedy(12)))}
    served = AsyncEngine(EngineArgs(model="default", kv_format="fp16", max_num_seqs=8, async_scheduling=True,
                                    overlap_outputs=True))

    async def consume(prompt, stop_after=None):
        pieces, last = [], None
        async for out in served.generate(prompt, greedy(12), prompt):
            pieces.append(out.text_delta)
            last = out
            if len(pieces) == stop_after:
                break  # the client goes away: its request is aborted
        return "".join(pieces), last

    async def together(*streams):
        return await asyncio.wait_for(asyncio.gather(*streams), timeout=60)

    try:
        results = asyncio.run(together(*(consume(p, 4 if p == PROMPTS[3] else None) for p in PROMPTS)))
        for prompt, (text, last) in zip(PROMPTS[:3], results):
            assert last.finished and text == last.text == reference[prompt]
        assert results[3][1].num_output_tokens == 4 and not results[3][1].finished
        assert not served.engine.has_unfinished()
        assert served.engine.cache.allocator.num_free == served.engine.cache.allocator.num_blocks
    finally:
        served.shutdown()
