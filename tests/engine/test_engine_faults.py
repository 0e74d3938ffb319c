"""One request's fault stays that request's: extreme sampling values, a failing sampler, a failing
step; the admission bound (running + waiting) holds under a burst; deadlines; the fault-injection test
hook; a dead engine thread fails every stream at once; the door's limits."""
import asyncio
import time

import pytest
import torch

from backend.engine import (AsyncEngine, EngineArgs, EngineDeadError, InjectedFault, LLMEngine, QueueFullError,
                            RequestFailedError)
from backend.sampling import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, SamplingParams

PROMPTS = ["The capital of France is", "Once upon a time", "def add(a, b):", "Water boils at"]


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(EngineArgs(model="default", kv_format="full", max_num_seqs=8))


def run(engine, requests, before_steps=lambda: None):
    """requests: {id: (prompt, params)} -> {id: final RequestOutput}, all added before the first step."""
    for rid, (prompt, params) in requests.items():
        engine.add_request(prompt, params, request_id=rid)
    before_steps()
    final = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks
    return final


def greedy(n=8):
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def test_extreme_sampling_values_run_beside_others(engine):
    """temperature=1e-300 overflowed the sampler and top_p=5e-324 rounds to 0 in float32: both failed
    every request of the step. Now the first samples greedily, the second keeps the top token."""
    reference = run(engine, {p: (p, greedy()) for p in PROMPTS})
    extreme = {"t": (PROMPTS[0], SamplingParams(max_tokens=8, temperature=1e-300, ignore_eos=True)),
               "p": (PROMPTS[1], SamplingParams(max_tokens=8, top_p=5e-324, ignore_eos=True, seed=1)),
               "tp": (PROMPTS[2], SamplingParams(max_tokens=8, temperature=1e-8, top_p=1e-300, ignore_eos=True))}
    final = run(engine, {**extreme, "other": (PROMPTS[3], greedy())})
    assert all(out.finish_reason == "length" and out.error is None for out in final.values())
    assert final["t"].token_ids == reference[PROMPTS[0]].token_ids
    assert final["p"].token_ids == reference[PROMPTS[1]].token_ids
    assert final["tp"].token_ids == reference[PROMPTS[2]].token_ids
    assert final["other"].token_ids == reference[PROMPTS[3]].token_ids


def test_a_request_whose_sampling_fails_fails_alone(engine):
    reference = run(engine, {p: (p, greedy()) for p in PROMPTS[1:]})
    broken = SamplingParams(max_tokens=8, temperature=0.7, seed=3)

    def break_it():  # past validation: its sampling raises in the step
        broken.top_k = "not a number"

    final = run(engine, {"broken": (PROMPTS[0], broken), **{p: (p, greedy()) for p in PROMPTS[1:]}}, break_it)
    assert final["broken"].finish_reason == "error" and "sampling failed" in final["broken"].error
    for p in PROMPTS[1:]:
        assert final[p].error is None and final[p].token_ids == reference[p].token_ids


def test_a_failed_step_fails_its_requests_and_the_engine_goes_on(engine, monkeypatch):
    reference = run(engine, {p: (p, greedy()) for p in PROMPTS[:2]})
    engine.add_request(PROMPTS[0], greedy(), request_id="in-step")
    engine.step()  # prefill: "in-step" now decodes
    calls = {"n": 0}
    forward = engine.model.forward

    def fail_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault")
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", fail_once)
    with pytest.raises(RuntimeError, match="injected fault"):
        engine.step()
    [failed] = engine.fail_step(RuntimeError("injected fault"))
    assert failed.request_id == "in-step" and failed.finish_reason == "error" and "injected fault" in failed.error
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks
    final = run(engine, {"after": (PROMPTS[1], greedy())})
    assert final["after"].token_ids == reference[PROMPTS[1]].token_ids


def test_async_engine_fails_the_step_requests_only_and_admits_running_plus_waiting(monkeypatch):
    """Capacity is max_num_seqs running + max_queue_size waiting, counted from the moment a request
    is accepted (it was short by the requests still in the engine thread's inbox)."""
    engine = AsyncEngine(EngineArgs(model="default", kv_format="full", max_num_seqs=2, max_queue_size=3))

    async def consume(rid, params):
        try:
            return [out async for out in engine.generate(PROMPTS[0], params, rid)][-1]
        except (QueueFullError, RequestFailedError) as e:
            return e

    async def burst():
        return await asyncio.gather(*(consume(f"r{i}", SamplingParams(max_tokens=4, temperature=0))
                                      for i in range(10)))

    try:
        results = asyncio.run(burst())
        assert sum(isinstance(r, QueueFullError) for r in results) == 5
        assert sum(not isinstance(r, Exception) and r.finish_reason == "length" for r in results) == 5

        forward = engine.engine.model.forward
        failing = {"on": True}

        def fail_while_on(*args, **kwargs):
            if failing["on"]:
                failing["on"] = False
                raise RuntimeError("injected fault")
            return forward(*args, **kwargs)

        monkeypatch.setattr(engine.engine.model, "forward", fail_while_on)
        first = asyncio.run(consume("a", SamplingParams(max_tokens=4, temperature=0)))
        assert isinstance(first, RequestFailedError) and "injected fault" in str(first)
        after = asyncio.run(consume("b", SamplingParams(max_tokens=4, temperature=0)))
        assert after.finish_reason == "length"
        stats = engine.engine.cache.allocator
        assert stats.num_free == stats.num_blocks
    finally:
        engine.shutdown()


def test_a_deadline_ends_a_waiting_or_running_request_and_frees_its_blocks(engine):
    reference = run(engine, {p: (p, greedy()) for p in PROMPTS[2:]})
    now = time.monotonic()
    long = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
    engine.add_request(PROMPTS[0], greedy(), request_id="late", deadline=now - 1)  # past before its first step
    engine.add_request(PROMPTS[1], long, request_id="slow", deadline=now + 0.5)
    final = run(engine, {p: (p, greedy()) for p in PROMPTS[2:]})  # run() checks every block is free again
    late, slow = final["late"], final["slow"]
    assert (late.finish_reason, late.num_output_tokens, late.error) == ("timeout", 0, None)
    assert slow.finish_reason == "timeout" and 0 < slow.num_output_tokens < 400
    for p in PROMPTS[2:]:
        assert final[p].token_ids == reference[p].token_ids
    assert not engine.deadlines


def test_an_injected_step_fault_fails_that_step_only(engine):
    """The test hook the server's fault tests use (fault="step"): the step carrying the request raises."""
    reference = run(engine, {PROMPTS[1]: (PROMPTS[1], greedy())})
    engine.add_request(PROMPTS[0], greedy(), request_id="faulty", fault="step")
    with pytest.raises(InjectedFault):
        engine.step()
    [failed] = engine.fail_step(InjectedFault("x"))
    assert failed.request_id == "faulty" and failed.finish_reason == "error" and not engine.faults
    final = run(engine, {PROMPTS[1]: (PROMPTS[1], greedy())})
    assert final[PROMPTS[1]].token_ids == reference[PROMPTS[1]].token_ids
    with pytest.raises(ValueError, match="fault"):
        engine.add_request(PROMPTS[0], greedy(), fault="meltdown")


def test_a_dead_engine_thread_fails_every_stream_at_once_and_refuses_the_next():
    deaths = []
    engine = AsyncEngine(EngineArgs(model="default", kv_format="full", max_num_seqs=2, max_queue_size=8),
                         on_death=deaths.append)

    async def consume(rid, fault=None, tokens=200):
        try:
            return [out async for out in engine.generate(PROMPTS[0], greedy(tokens), rid, fault=fault)][-1]
        except Exception as e:  # noqa: BLE001 - the test looks at it
            return e

    async def scenario():
        streams = [asyncio.ensure_future(consume(f"s{i}")) for i in range(4)]  # 2 running, 2 waiting
        await asyncio.sleep(0.5)
        fault = await consume("kill", fault="engine")
        results = await asyncio.wait_for(asyncio.gather(*streams), timeout=10)
        return fault, results, await consume("after")

    try:
        fault, results, after = asyncio.run(scenario())
        for e in [fault, *results, after]:
            assert isinstance(e, EngineDeadError) and "InjectedFault" in str(e), e
        # the streams are failed first, then on_death runs (the server stops after its clients are told)
        deadline = time.monotonic() + 5
        while not deaths and time.monotonic() < deadline:
            time.sleep(0.01)
        assert deaths == [engine.dead] and "engine stopped" in engine.dead
        assert not engine.thread.is_alive() and not engine.streams
    finally:
        engine.shutdown()


def test_door_limits_bound_stop_strings_and_prompt_bytes(engine):
    limits = engine.limits
    assert limits.max_prompt_bytes == (engine.max_model_len - 1) * engine.tokenizer.max_token_bytes
    assert engine.tokenizer.max_token_bytes == 81  # SmolLM2's longest token: 80 '#' or a newline and 80 spaces
    for bad in ({"stop": ["x" * (MAX_STOP_STRING_CHARS + 1)]}, {"stop": ["a"] * (MAX_STOP_STRINGS + 1)},
                {"stop_token_ids": [1] * (MAX_STOP_TOKEN_IDS + 1)}):
        with pytest.raises(ValueError, match=next(iter(bad))) as e:
            SamplingParams.from_dict(bad, limits)
        assert len(str(e.value)) < 400  # the message names the value without echoing all of it
    SamplingParams.from_dict({"stop": ["x" * MAX_STOP_STRING_CHARS] * MAX_STOP_STRINGS,
                              "stop_token_ids": [1] * MAX_STOP_TOKEN_IDS}, limits)


def test_overlapped_outputs_reach_their_streams_in_order_during_the_next_launch(engine):
    """`overlap_outputs`: a step's outputs go to their streams while the next step's forward is queued (here the
    CPU's forward, already done), and every stream still gets each piece once, in order, and its end: the same
    text as the offline engine's; only the last step's outputs, with nothing left to run, go out at once. An abort
    mid-stream ends that stream after its held pieces; the other runs on to the same text."""
    lengths = (3, 6, 9)
    reference = run(engine, {p: (p, greedy(n)) for p, n in zip(PROMPTS, lengths)})
    served = AsyncEngine(EngineArgs(model="default", kv_format="full", max_num_seqs=8, overlap_outputs=True))
    launching, sent_in_launch = [False], []
    deliver, send = served.engine.on_launch, served._send

    def launch():
        launching[0] = True
        deliver()
        launching[0] = False

    def record(request_id, item):
        sent_in_launch.append(launching[0])
        send(request_id, item)

    served.engine.on_launch, served._send = launch, record

    async def consume(prompt, n, stop_after=None):
        pieces, last = [], None
        async for out in served.generate(prompt, greedy(n), f"{prompt}-{n}"):
            pieces.append(out.text_delta)
            last = out
            if len(pieces) == stop_after:
                break  # the client goes away: its request is aborted
        return "".join(pieces), last

    def streams(*args):
        async def together():
            return await asyncio.wait_for(asyncio.gather(*(consume(*a) for a in args)), timeout=60)
        return asyncio.run(together())

    try:
        for prompt, (text, last) in zip(PROMPTS, streams(*zip(PROMPTS, lengths))):
            assert last.finished and text == last.text == reference[prompt].text
        assert len(sent_in_launch) == sum(lengths) and sent_in_launch.count(False) == 1
        (text, last), (_, cut) = streams((PROMPTS[2], 9), (PROMPTS[3], 40, 2))
        assert last.finished and text == reference[PROMPTS[2]].text
        assert cut.num_output_tokens == 2 and not cut.finished
        assert not served.engine.has_unfinished()
        assert served.engine.cache.allocator.num_free == served.engine.cache.allocator.num_blocks
    finally:
        served.shutdown()
