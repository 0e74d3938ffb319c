"""Faults, overload and a stop, each against a real tritonserver of its own (tests/conftest.py's
`launch_server`): the tests here end or break their server, so none uses the session one.

- `fault_server` (room for 108 requests, the fault-injection test hook on): a hundred streams cancelled
  at once free every KV block; a deadline ends a request with finish_reason "timeout"; a failed engine
  step fails its requests and serving goes on; a dead engine thread fails every stream at once and stops
  the server (its last test);
- `small_server` (2 running + 2 waiting): arrivals above that are refused at once while the admitted
  requests keep their pace, and the server recovers by itself; a killed Python-backend stub makes the
  launcher stop the server and exit 1 (its last test);
- `drain_server`: SIGTERM to the launcher while streams run: short ones complete, long ones end with an
  error at the drain deadline, the launcher exits 0 within the exit timeout.

Each test prints what it measured (`pytest -s`); README "Faults" holds the figures.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import statistics
import threading
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from client import ServerError, complete, stream
from server.model_config import variant_repository
from server.serve import DRAIN_MARGIN_S, python_stubs
from server_checks import CLOSE, metric, scrape, wait_for

PROMPT = "Once upon a time, in a small village by the sea,"
GREEDY = {"temperature": 0, "ignore_eos": True}
EXIT_TIMEOUT_S = 15
# One torch thread per test server: the clients of these tests need the other core.
FAULT_PARAMETERS = {"max_num_seqs": "8", "max_queue_size": "100", "torch_num_threads": "1"}
SMALL_PARAMETERS = {"max_num_seqs": "2", "max_queue_size": "2", "torch_num_threads": "1"}
DRAIN_PARAMETERS = {"torch_num_threads": "1"}


def report(what: str, **figures):
    print(f"\n[faults] {what}: " + ", ".join(f"{k}={v}" for k, v in figures.items()), flush=True)


def server_of(launch_server, tmp_path_factory, name: str, parameters: dict, env: dict | None = None):
    root = tmp_path_factory.mktemp(name)
    return launch_server(root, ("smollm2",), variant_repository(root, "smollm2", parameters), env=env,
                         exit_timeout_s=EXIT_TIMEOUT_S)


def blocks_in_use(server) -> float:
    return metric(scrape(server), "alrkvd:kv_cache_blocks_used", server.model)


def idle(server) -> bool:
    s = scrape(server)
    return all(metric(s, name, server.model) == 0 for name in
               ("alrkvd:kv_cache_blocks_used", "alrkvd:num_requests_running", "alrkvd:num_requests_waiting"))


def assert_serves(server):
    r = complete("Hello", url=server.grpc_url, model=server.model, max_tokens=2, **GREEDY)
    assert (r.num_output_tokens, r.finish_reason) == (2, "length")


def ready(server) -> int | str:
    """/v2/health/ready's status, or the connection error's name."""
    try:
        return requests.get(f"http://{server.http_url}/v2/health/ready", timeout=2, headers=CLOSE).status_code
    except requests.RequestException as e:
        return type(e).__name__


class Streams:
    """Streams run on threads with the project's client; each records its chunks' times and how it ended."""

    def __init__(self):
        self.chunks: dict[str, list[float]] = {}
        self.ended: dict[str, object] = {}  # a Completion-like tuple or the exception
        self.threads: list[threading.Thread] = []

    def start(self, name: str, server, protocol: str, **kwargs):
        url = server.grpc_url if protocol == "grpc" else server.http_url
        self.chunks[name] = []

        def run():
            last = None
            try:
                for chunk in stream(PROMPT, url=url, protocol=protocol, model=server.model, timeout_s=120, **kwargs):
                    if chunk.text:
                        self.chunks[name].append(chunk.t)
                    last = chunk
                self.ended[name] = (last.finish_reason if last else None, time.monotonic())
            except Exception as e:  # noqa: BLE001 - the test looks at it
                self.ended[name] = (e, time.monotonic())

        t = threading.Thread(target=run, name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def join(self, timeout: float = 120):
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(timeout=max(0.1, deadline - time.monotonic()))
        return self.ended


# ----------------------------------------------------------------------------------------------
# fault_server: cancellations, deadlines, a failed step, a dead engine
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fault_server(launch_server, tmp_path_factory):
    server = server_of(launch_server, tmp_path_factory, "faults", FAULT_PARAMETERS, {"ALRKVD_TEST_FAULTS": "1"})
    yield server
    server.stop()


class GrpcStream:
    """One streamed request on a gRPC stream of its own; `cancel()` cancels it from any thread."""

    def __init__(self, server, prompt: str, max_tokens: int):
        self.responses = 0
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.client.start_stream(callback=self._on_response)
        inputs = []
        for name, value, dtype in [("text_input", prompt.encode(), "BYTES"), ("stream", True, "BOOL"),
                                   ("exclude_input_in_output", True, "BOOL"),
                                   ("sampling_parameters", json.dumps({"max_tokens": max_tokens, **GREEDY}).encode(),
                                    "BYTES")]:
            t = grpcclient.InferInput(name, [1], dtype)
            t.set_data_from_numpy(np.array([value], dtype=bool if dtype == "BOOL" else np.object_))
            inputs.append(t)
        self.client.async_stream_infer(server.model, inputs)

    def _on_response(self, result, error):
        self.responses += 1

    def cancel(self):
        self.client.stop_stream(cancel_requests=True)
        self.client.close()


class HttpStream:
    """One POST .../generate_stream on a raw socket; `cancel()` drops the connection from any thread."""

    def __init__(self, server, prompt: str, max_tokens: int):
        self.events = 0
        host, port = server.http_url.split(":")
        body = json.dumps({"text_input": prompt, "stream": True, "max_tokens": max_tokens, **GREEDY}).encode()
        self.sock = socket.create_connection((host, int(port)))
        self.sock.sendall(f"POST /v2/models/{server.model}/generate_stream HTTP/1.1\r\nHost: {host}\r\n"
                          f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                          "Connection: close\r\n\r\n".encode() + body)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            self.events += data.count(b"data:")

    def cancel(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def test_a_hundred_streams_cancelled_at_once_free_every_block(fault_server):
    """50 gRPC + 50 HTTP streams, started over 2 s (8 decode, the rest wait), all cancelled at once: every KV
    block comes back, every request counts as cancelled, and the next request is served. (Triton sees a
    closed HTTP connection only when it writes to it: a waiting HTTP request is found at its first token.)"""
    server, model = fault_server, fault_server.model
    before = scrape(server)
    cancelled0 = metric(before, "alrkvd:request_success_total", model, finished_reason="cancelled")
    refused0 = metric(before, "alrkvd:request_failure_total", model, reason="queue_full")
    rng = random.Random(37)
    streams = []
    for i in range(100):
        kind = GrpcStream if i % 2 == 0 else HttpStream
        streams.append(kind(server, f"Story {i}: {PROMPT}", max_tokens=rng.randint(200, 400)))
        time.sleep(rng.uniform(0, 0.04))
    assert wait_for(lambda: blocks_in_use(server) > 0, timeout=30), "the streams should hold KV blocks"
    time.sleep(1.0)
    rng.shuffle(streams)
    received = sorted(getattr(s, "responses", getattr(s, "events", 0)) for s in streams)
    t_cancel = time.monotonic()
    for s in streams:
        s.cancel()
    t_cancelled = time.monotonic()
    freed = wait_for(lambda: idle(server), timeout=60, interval=0.1)
    t_free = time.monotonic()
    after = scrape(server)
    cancelled = metric(after, "alrkvd:request_success_total", model, finished_reason="cancelled") - cancelled0
    refused = metric(after, "alrkvd:request_failure_total", model, reason="queue_full") - refused0
    report("100 streams cancelled at once", cancel_calls_s=round(t_cancelled - t_cancel, 2),
           time_to_free_s=round(t_free - t_cancel, 2), cancelled=cancelled, refused=refused,
           responses_before_cancel=f"min {received[0]} median {received[50]} max {received[-1]}")
    assert freed, "KV blocks or requests left after cancelling every stream"
    assert wait_for(lambda: metric(scrape(server), "alrkvd:request_success_total", model,
                                   finished_reason="cancelled") - cancelled0 == 100, timeout=10)
    assert refused == 0
    assert_serves(server)


def test_a_deadline_ends_the_request_with_finish_reason_timeout(fault_server):
    """Triton's request timeout (tritonclient's timeout=, HTTP's "timeout", microseconds) is the deadline."""
    server, model = fault_server, fault_server.model
    timeouts0 = metric(scrape(server), "alrkvd:request_success_total", model, finished_reason="timeout")
    for protocol, url in (("grpc", server.grpc_url), ("http", server.http_url)):
        r = complete(PROMPT, url=url, protocol=protocol, model=model, max_tokens=400, deadline_s=1.0, **GREEDY)
        report(f"deadline 1 s ({protocol})", finish_reason=r.finish_reason, tokens=r.num_output_tokens,
               e2e_s=round(r.e2e_s, 2))
        assert r.finish_reason == "timeout" and 0 < r.num_output_tokens < 400
        assert 1.0 <= r.e2e_s < 5.0
    assert wait_for(lambda: metric(scrape(server), "alrkvd:request_success_total", model,
                                   finished_reason="timeout") - timeouts0 == 2, timeout=10)
    assert wait_for(lambda: idle(server), timeout=10)
    with pytest.raises(ServerError, match="'timeout'.*3600 s"):
        complete(PROMPT, url=server.grpc_url, model=model, deadline_s=3601)


def test_a_failed_engine_step_fails_its_requests_and_serving_goes_on(fault_server):
    server, model = fault_server, fault_server.model
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="engine step failed: InjectedFault") as e:
        complete(PROMPT, url=server.grpc_url, model=model, max_tokens=8, test_fault="step", **GREEDY)
    report("failed step", client_saw=e.value.message, after_s=round(time.monotonic() - t0, 2))
    assert wait_for(lambda: idle(server), timeout=10)
    assert ready(server) == 200
    assert_serves(server)


def test_a_dead_engine_fails_every_stream_at_once_and_stops_the_server(fault_server):
    """The engine thread raises outside a step: its streams fail with UNAVAILABLE, the health endpoints stop
    answering ready, and the launcher exits 1 (the model stopped tritonserver). Ends the server."""
    server = fault_server
    streams = Streams()
    for i, protocol in enumerate(("grpc", "http", "grpc")):
        streams.start(f"s{i}", server, protocol, max_tokens=400, **GREEDY)
    assert wait_for(lambda: all(streams.chunks.values()), timeout=30)
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="the engine stopped: InjectedFault"):
        complete(PROMPT, url=server.grpc_url, model=server.model, max_tokens=8, test_fault="engine")
    not_ready = wait_for(lambda: ready(server) != 200, timeout=20, interval=0.1)
    t_not_ready = time.monotonic()
    ended = streams.join(timeout=30)
    server.process.wait(timeout=EXIT_TIMEOUT_S + 30)
    t_exit = time.monotonic()
    report("dead engine", streams_failed_after_s=[round(t - t0, 2) for _, t in ended.values()],
           not_ready_after_s=round(t_not_ready - t0, 2), launcher_exit=server.process.returncode,
           launcher_exit_after_s=round(t_exit - t0, 2), client_saw=str(next(iter(ended.values()))[0])[:120])
    assert not_ready
    for error, _ in ended.values():
        assert isinstance(error, ServerError) and "the engine stopped" in error.message, error
    assert server.process.returncode == 1
    assert "stopping tritonserver" in server.log_tail(400)
    assert not server.leftover_processes()


# ----------------------------------------------------------------------------------------------
# small_server: overload, then a killed stub
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_server(launch_server, tmp_path_factory):
    server = server_of(launch_server, tmp_path_factory, "small", SMALL_PARAMETERS)
    yield server
    server.stop()


def gaps(times: list[float], start: float, end: float) -> list[float]:
    inside = [t for t in times if start <= t <= end]
    return [b - a for a, b in zip(inside, inside[1:])]


def test_overload_is_refused_at_once_and_admitted_requests_keep_their_pace(small_server):
    """2 running + 2 waiting admitted; 40 more arrive meanwhile: each is refused with UNAVAILABLE at once,
    the running streams' inter-token gaps do not grow, and once the load is gone the server serves again."""
    server, model = small_server, small_server.model
    alone = complete(PROMPT, url=server.grpc_url, model=model, max_tokens=24, **GREEDY)
    admitted = Streams()
    for i in range(4):
        # (long enough that the running pair still streams through the flood, on a fast machine too)
        admitted.start(f"a{i}", server, "grpc" if i % 2 == 0 else "http", max_tokens=160, **GREEDY)
    assert wait_for(lambda: sum(len(c) >= 3 for c in admitted.chunks.values()) == 2, timeout=60, interval=0.05)
    assert wait_for(lambda: metric(scrape(server), "alrkvd:num_requests_waiting", model) == 2, timeout=10)
    # the OpenAI front says so in its own terms: 503 in OpenAI's error shape
    r = requests.post(f"{server.openai_url}/chat/completions", headers=CLOSE, timeout=60,
                      json={"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4})
    assert r.status_code == 503 and "queue is full" in r.json()["error"]["message"], r.text
    t_quiet = time.monotonic()
    time.sleep(1.5)  # the running pair's pace before the flood
    refusals, accepted, lock = [], [], threading.Lock()

    def flood():
        for _ in range(10):
            t = time.perf_counter()
            r = requests.post(f"http://{server.http_url}/v2/models/{model}/generate", headers=CLOSE, timeout=60,
                              json={"text_input": PROMPT, "max_tokens": 4, **GREEDY})
            with lock:
                (accepted if r.status_code == 200 else refusals).append((time.perf_counter() - t, r.text))

    t_flood = time.monotonic()
    flooders = [threading.Thread(target=flood) for _ in range(4)]
    for t in flooders:
        t.start()
    for t in flooders:
        t.join(timeout=120)
    t_flood_end = time.monotonic()
    ended = admitted.join(timeout=180)
    running = [c for c in admitted.chunks.values() if c and c[0] < t_quiet]  # the pair that ran first
    before = [g for c in running for g in gaps(c, t_quiet, t_flood)]
    # refusals take milliseconds: the flood can end within a step, so its window is as long as the quiet one
    during = [g for c in running for g in gaps(c, t_flood, max(t_flood_end, t_flood + 1.5))]
    latency = sorted(s for s, _ in refusals)
    report("overload (capacity 2 running + 2 waiting, 40 arrivals over it)",
           accepted=len(accepted), refused=len(refusals), flood_s=round(t_flood_end - t_flood, 2),
           refusal_p50_ms=round(1000 * statistics.median(latency), 1),
           refusal_max_ms=round(1000 * latency[-1], 1),
           itl_alone_ms=round(1000 * alone.mean_itl_s, 1),
           itl_running_before_ms=round(1000 * statistics.median(before), 1),
           itl_running_during_ms=round(1000 * statistics.median(during), 1))
    assert not accepted and len(refusals) == 40
    assert all("queue is full" in text for _, text in refusals), refusals[0]
    assert statistics.median(latency) < 1.0 and latency[-1] < 5.0  # at once, not after a timeout
    assert statistics.median(during) < 3 * statistics.median(before) + 0.05
    assert all(reason == "length" for reason, _ in ended.values()), ended
    assert wait_for(lambda: idle(server), timeout=10)
    assert_serves(server)


def test_a_killed_stub_makes_the_launcher_stop_the_server(small_server):
    """SIGKILL to the model's stub process. Triton 2.51 alone (README "Faults"): the model and the server stay
    ready, new requests fail after ~1 s with "Stub process 'smollm2_0_0' is not healthy.", running streams
    hang until the client gives up. The launcher's watchdog stops the server and exits 1. Ends the server."""
    server = small_server
    streams = Streams()
    streams.start("running", server, "grpc", max_tokens=400, **GREEDY)
    assert wait_for(lambda: streams.chunks["running"], timeout=30)
    [(stub, instance)] = python_stubs(server.tritonserver_pid).items()
    assert instance == "smollm2_0_0"
    t0 = time.monotonic()
    os.kill(stub, signal.SIGKILL)
    try:
        complete(PROMPT, url=server.grpc_url, model=server.model, max_tokens=2, timeout_s=30)
        new_request = "served"
    except Exception as e:  # noqa: BLE001 - reported
        new_request = str(e)[:100]
    t_new = time.monotonic()
    not_ready = wait_for(lambda: ready(server) != 200, timeout=20, interval=0.1)
    t_not_ready = time.monotonic()
    server.process.wait(timeout=EXIT_TIMEOUT_S + 30)
    t_exit = time.monotonic()
    ended = streams.join(timeout=30)
    report("killed stub", new_request=new_request, new_request_s=round(t_new - t0, 2),
           not_ready_after_s=round(t_not_ready - t0, 2), launcher_exit=server.process.returncode,
           launcher_exit_after_s=round(t_exit - t0, 2), running_stream=str(ended["running"][0])[:80],
           running_stream_ended_after_s=round(ended["running"][1] - t0, 2))
    assert new_request != "served"
    assert not_ready
    assert server.process.returncode == 1
    assert "the Python-backend stub of smollm2_0_0 died" in server.log_tail(400)
    assert isinstance(ended["running"][0], Exception)
    assert not server.leftover_processes()


# ----------------------------------------------------------------------------------------------
# drain_server: SIGTERM while streams run
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def drain_server(launch_server, tmp_path_factory):
    server = server_of(launch_server, tmp_path_factory, "drain", DRAIN_PARAMETERS)
    yield server
    server.stop()


def test_sigterm_drains_running_streams_within_the_exit_timeout(drain_server):
    server = drain_server
    drain_s = EXIT_TIMEOUT_S - DRAIN_MARGIN_S
    streams = Streams()
    for protocol in ("grpc", "http"):
        streams.start(f"short-{protocol}", server, protocol, max_tokens=10, **GREEDY)
        streams.start(f"long-{protocol}", server, protocol, max_tokens=400, **GREEDY)
    assert wait_for(lambda: all(streams.chunks.values()), timeout=60, interval=0.05)
    t0 = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    time.sleep(1.0)  # the models have read the drain file; gRPC still takes requests, HTTP no longer does
    with pytest.raises(ServerError, match="shutting down") as refused:
        complete(PROMPT, url=server.grpc_url, model=server.model, max_tokens=2, timeout_s=30)
    ended = streams.join(timeout=EXIT_TIMEOUT_S + 30)
    server.process.wait(timeout=EXIT_TIMEOUT_S + 30)
    t_exit = time.monotonic()
    report(f"SIGTERM with 4 streams running (exit timeout {EXIT_TIMEOUT_S} s, drain {drain_s} s)",
           **{name: f"{str(how)[:70]!r} after {t - t0:.2f} s" for name, (how, t) in sorted(ended.items())},
           new_request=refused.value.message, launcher_exit=server.process.returncode,
           launcher_exit_after_s=round(t_exit - t0, 2))
    for protocol in ("grpc", "http"):
        assert ended[f"short-{protocol}"][0] == "length"
        error, t = ended[f"long-{protocol}"]
        assert isinstance(error, ServerError) and "did not finish within the drain time" in error.message, error
        assert drain_s - 1 <= t - t0 <= EXIT_TIMEOUT_S
    assert server.process.returncode == 0 and t_exit - t0 <= EXIT_TIMEOUT_S + 5
    assert not server.leftover_processes()
