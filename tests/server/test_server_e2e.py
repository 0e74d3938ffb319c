"""End to end against a real tritonserver (the session `triton_server` fixture, tests/conftest.py).

Streams over gRPC and HTTP, non-streamed vs streamed text, concurrency, cancellation, bad input,
a full queue and the metrics on /metrics. Greedy decoding everywhere, so texts are comparable.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from client import ServerError, complete, stream
from server_checks import CLOSE, assert_dropped_stream_frees_blocks, metric, scrape, wait_for

PROMPT = "Once upon a time, in a small village by the sea,"
GREEDY = {"temperature": 0, "ignore_eos": True}


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def http_generate(server, body: dict, model: str | None = None, stream_: bool = False):
    kind = "generate_stream" if stream_ else "generate"
    return requests.post(f"http://{server.http_url}/v2/models/{model or server.model}/{kind}",
                         json=body, timeout=300, headers=CLOSE)


def assert_serves(server):
    """The next request after an error succeeds."""
    r = complete("Hello", url=server.grpc_url, model=server.model, max_tokens=2, **GREEDY)
    assert r.num_output_tokens == 2 and r.finish_reason == "length"


# ----------------------------------------------------------------------------------------------
# completions
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(triton_server):
    """Non-streamed greedy completion over HTTP /generate, the reference text."""
    r = http_generate(triton_server, {"text_input": PROMPT, "exclude_input_in_output": True,
                                      "return_finish_reason": True, "return_num_output_tokens": True,
                                      "parameters": {"max_tokens": 24, **GREEDY}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["finish_reason"] in ("length", ["length"])
    return body["text_output"]


def test_grpc_streamed_completion(triton_server, reference):
    r = complete(PROMPT, url=triton_server.grpc_url, protocol="grpc", model=triton_server.model,
                 max_tokens=24, **GREEDY)
    assert len(r.pieces) > 1, "expected the text in several streamed pieces"
    assert r.text == reference
    assert (r.finish_reason, r.num_output_tokens) == ("length", 24)
    assert r.num_input_tokens > 5
    assert 0 < r.ttft_s < r.e2e_s


def test_http_generate_stream_completion(triton_server, reference):
    # a request "id" (the generate extension's optional field) is the request's id, not a sampling key
    r = complete(PROMPT, url=triton_server.http_url, protocol="http", model=triton_server.model,
                 request_id="http-stream-1", max_tokens=24, **GREEDY)
    assert len(r.pieces) > 1
    assert r.text == reference
    assert (r.finish_reason, r.num_output_tokens) == ("length", 24)


def test_non_streamed_text_repeats_prompt_unless_excluded(triton_server, reference):
    r = http_generate(triton_server, {"text_input": PROMPT, "max_tokens": 24, **GREEDY})
    assert r.status_code == 200, r.text
    assert r.json()["text_output"] == PROMPT + reference


def test_vllm_style_sampling_parameters_input(triton_server, reference):
    """The vLLM backend's clients send sampling_parameters as a JSON string of strings."""
    sampling = json.dumps({"max_tokens": "24", "temperature": "0", "ignore_eos": "true"})
    r = http_generate(triton_server, {"text_input": PROMPT, "stream": False,
                                      "exclude_input_in_output": True, "sampling_parameters": sampling})
    assert r.status_code == 200, r.text
    assert r.json()["text_output"] == reference


def test_raw_tritonclient_grpc_stream(triton_server, reference):
    """tritonclient, the way the vLLM backend's samples use it: final flag exactly once."""
    import queue

    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    inputs = []
    for name, value, dtype in [("text_input", PROMPT.encode(), "BYTES"), ("stream", True, "BOOL"),
                               ("sampling_parameters", json.dumps({"max_tokens": 24, **GREEDY}).encode(), "BYTES")]:
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=bool if dtype == "BOOL" else np.object_))
        inputs.append(t)
    client.async_stream_infer(triton_server.model, inputs, request_id="raw-1", enable_empty_final_response=True)
    pieces, finals = [], 0
    while True:
        result, error = results.get(timeout=120)
        assert error is None, error
        out = result.as_numpy("text_output")
        if out is not None:
            pieces.append(out[0].decode())
        if result.get_response().parameters["triton_final_response"].bool_param:
            finals += 1
            break
    client.stop_stream()
    # nothing arrives after the final response
    time.sleep(0.5)
    assert results.empty()
    client.close()
    assert finals == 1
    assert "".join(pieces) == reference


def test_eight_concurrent_streams_complete(triton_server):
    results, errors = {}, []

    def run(i):
        try:
            proto = "grpc" if i % 2 == 0 else "http"
            url = triton_server.grpc_url if proto == "grpc" else triton_server.http_url
            results[i] = complete(f"Story number {i}: {PROMPT}", url=url, protocol=proto,
                                  model=triton_server.model, max_tokens=16, **GREEDY)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((i, e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert sorted(results) == list(range(8))
    for r in results.values():
        assert (r.finish_reason, r.num_output_tokens) == ("length", 16)
        assert r.text


def test_extreme_sampling_values_fail_nobody(triton_server):
    """temperature=1e-300 and top_p=5e-324 passed validation and then failed the sampler, which
    failed every request of the step: they now decode like greedy, beside four normal streams."""
    results, errors = {}, []
    extreme = {"t": {"temperature": 1e-300, "ignore_eos": True}, "p": {"top_p": 5e-324, "ignore_eos": True}}
    cases = {**extreme, **{i: GREEDY for i in range(4)}}

    def run(key):
        try:
            results[key] = complete(PROMPT, url=triton_server.grpc_url, model=triton_server.model,
                                    max_tokens=16, **cases[key])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((key, e))

    threads = [threading.Thread(target=run, args=(k,)) for k in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert sorted(map(str, results)) == sorted(map(str, cases))
    assert all(r.finish_reason == "length" and r.num_output_tokens == 16 and r.text for r in results.values())


def test_dummy_moe_model_serves(triton_server):
    if "qwen3moe_dummy" not in triton_server.models:
        pytest.skip("qwen3moe_dummy not loaded (ALRKVD_TEST_MODELS)")
    r = complete("Route me through the experts", url=triton_server.grpc_url, model="qwen3moe_dummy",
                 max_tokens=8, **GREEDY)
    assert (r.finish_reason, r.num_output_tokens) == ("length", 8)
    # Its experts stream through a device cache of half their bytes (config.pbtxt): some must
    # have been copied, and the hit rate is a fraction.
    samples = wait_for(lambda: (s := scrape(triton_server)) and
                       metric(s, "alrkvd:expert_bytes_streamed", "qwen3moe_dummy") > 0 and s)
    assert samples, "no expert bytes streamed"
    assert 0 < metric(samples, "alrkvd:expert_hit_rate", "qwen3moe_dummy") < 1
    assert metric(samples, "alrkvd:expert_bytes_streamed", "smollm2") == 0  # dense model: nothing to stream


def test_moe_routing_on_metrics(triton_server):
    """smollm2_moe reports, per MoE layer, its busiest expert's routed tokens over the mean (>= 1 once
    tokens ran); a dense model has no such series."""
    if "smollm2_moe" not in triton_server.models:
        pytest.fail("smollm2_moe is not served (ALRKVD_TEST_MODELS)")
    r = complete("Route me through the experts", url=triton_server.grpc_url, model="smollm2_moe",
                 max_tokens=4, **GREEDY)
    assert r.num_output_tokens == 4
    samples = wait_for(lambda: (s := scrape(triton_server)) and
                       metric(s, "alrkvd:moe_expert_load_imbalance", "smollm2_moe", layer="29") >= 1 and s)
    assert samples, "no routing on /metrics"
    for layer in range(30):
        assert 1 <= metric(samples, "alrkvd:moe_expert_load_imbalance", "smollm2_moe", layer=str(layer)) <= 64
    with pytest.raises(KeyError):
        metric(samples, "alrkvd:moe_expert_load_imbalance", "smollm2", layer="0")


# ----------------------------------------------------------------------------------------------
# cancellation
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_cancelled_stream_frees_kv_blocks(triton_server, protocol):
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    # closing the generator: gRPC stream cancel; HTTP: connection closed
    assert_dropped_stream_frees_blocks(triton_server, lambda: stream(
        PROMPT, url=url, protocol=protocol, model=triton_server.model, max_tokens=500, **GREEDY))
    assert_serves(triton_server)


# ----------------------------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------------------------

BAD_PARAMETERS = [
    ({"bogus": 1}, "bogus"),
    ({"temperature": "hot"}, "temperature"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"max_tokens": 10**9}, "max_tokens"),
    ({"max_tokens": 513}, "at most 512 tokens"),  # the config's max_output_tokens
    ({"top_p": 0}, "top_p"),
    ({"top_k": 10**7}, "top_k"),
    ({"seed": -1}, "seed"),
    ({"stop": [1, 2]}, "stop"),
    ({"priority": "high"}, "priority"),
    # limits (README "Limits")
    ({"stop": ["x" * 257]}, "256 characters"),
    ({"stop_token_ids": list(range(65))}, "at most 64 token ids"),
    ({"priority": 2**40}, "2**31"),
    ({"timeout": 3600 * 10**6 + 1}, "timeout"),  # Triton's request timeout, microseconds: at most an hour
    # nothing in a request names a file, a model or an engine option
    ({"kv_format": "fp16", "tokenizer": "/tmp"}, "unknown sampling parameter(s) ['kv_format', 'tokenizer']"),
    ({"test_fault": "engine"}, "unknown sampling parameter(s) ['test_fault']"),  # the test hook is off
]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("params,named", BAD_PARAMETERS, ids=[n for _, n in BAD_PARAMETERS])
def test_bad_sampling_parameters_are_refused(triton_server, protocol, params, named):
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    with pytest.raises(ServerError) as e:
        complete(PROMPT, url=url, protocol=protocol, model=triton_server.model, **params)
    assert named in e.value.message
    if protocol == "http":
        assert e.value.status == 400


BAD_BODIES = [
    ({"text_input": "Hi", "sampling_parameters": "{not json"}, "sampling_parameters"),
    ({"text_input": "Hi", "sampling_parameters": "[1, 2]"}, "sampling_parameters"),
    ({"text_input": ""}, "text_input"),
    ({"text_input": "Hi", "stream": True, "exclude_input_in_output": False}, "exclude_input_in_output"),
    ({"text_input": "hello " * 2500, "max_tokens": 4}, "tokens"),
    # refused before tokenizing: more bytes than 2,047 tokens of at most 81 bytes each can hold
    ({"text_input": "a" * 200_000}, "this model takes at most 165807"),
    ({"text_input": "Hi", "sampling_parameters": json.dumps({"stop": ["a"] * 20_000})}, "at most 65536"),
    ({"text_input": "Hi", "id": "x" * 300}, "request id has 300 characters"),
    # nothing in a request names a file or a model
    ({"text_input": "Hi", "model": "/etc/passwd"}, "unknown sampling parameter(s) ['model']"),
    ({"text_input": "Hi", "sampling_parameters": json.dumps({"load_format": "dummy", "lora_path": "/tmp/x"})},
     "unknown sampling parameter(s) ['load_format', 'lora_path']"),
]


@pytest.mark.parametrize("body,named", BAD_BODIES, ids=["json", "not-object", "empty", "stream-prepend", "too-long",
                                                       "prompt-bytes", "parameters-bytes", "request-id", "model-path",
                                                       "engine-options"])
def test_bad_requests_are_refused_with_400(triton_server, body, named):
    r = http_generate(triton_server, body, stream_=True)
    assert r.status_code == 400, r.text
    assert named in r.text
    assert_serves(triton_server)


def test_server_binds_to_the_loopback_and_keeps_model_control_off(triton_server):
    """The launcher's defaults (tests/conftest.py passes no --host): loopback only, no model control, and the
    repository API closed behind the admin key, over HTTP and gRPC; the model stays ready."""
    import base64
    import socket

    argv = open(f"/proc/{triton_server.tritonserver_pid}/cmdline", "rb").read().decode().split("\0")
    for endpoint in ("http", "grpc", "metrics"):
        assert f"--{endpoint}-address=127.0.0.1" in argv
    assert "--model-control-mode=none" in argv
    port = int(triton_server.http_url.split(":")[1])
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this picks the address of the default route
        address = probe.getsockname()[0]
    except OSError:
        address = "127.0.0.1"
    finally:
        probe.close()
    if not address.startswith("127."):
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=2).close()
    base = f"http://{triton_server.http_url}/v2/repository"
    config = json.dumps({"backend": "python", "max_batch_size": 0})
    for path, body in (("models/smollm2/unload", {}), ("index", {}),
                       ("models/evil/load", {"parameters": {"config": config,
                                                            "file:1/model.py": base64.b64encode(b"x").decode()}})):
        r = requests.post(f"{base}/{path}", json=body, timeout=10, headers=CLOSE)
        assert r.status_code == 403 and "restricted" in r.text, (path, r.status_code, r.text)
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    with pytest.raises(Exception, match="restricted"):
        client.unload_model(triton_server.model)
    client.close()
    assert requests.get(f"http://{triton_server.http_url}/v2/models/{triton_server.model}/ready",
                        timeout=10, headers=CLOSE).status_code == 200
    assert_serves(triton_server)


def test_invalid_utf8_prompt_is_refused(triton_server):
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    errors = []
    client.start_stream(callback=lambda result, error: errors.append(error))
    t = grpcclient.InferInput("text_input", [1], "BYTES")
    t.set_data_from_numpy(np.array([b"caf\xc3\x28 \xff"], dtype=np.object_))
    client.async_stream_infer(triton_server.model, [t])
    assert wait_for(lambda: errors, timeout=30)
    client.stop_stream()
    client.close()
    assert errors[0] is not None and "UTF-8" in errors[0].message()
    assert_serves(triton_server)


def test_full_queue_is_unavailable_and_server_recovers(triton_server):
    """More streams than running slots + queue: the surplus is refused, the rest still run."""
    model = triton_server.model
    config = requests.get(f"http://{triton_server.http_url}/v2/models/{model}/config", timeout=10,
                          headers=CLOSE).json()
    params = {k: v["string_value"] for k, v in config["parameters"].items()}
    capacity = int(params["max_num_seqs"]) + int(params["max_queue_size"])
    n = capacity + 8
    started, refused = [], []
    release = threading.Event()
    lock = threading.Lock()

    def run(i):
        gen = stream(f"{i} {PROMPT}", url=triton_server.http_url, protocol="http", model=model,
                     max_tokens=200, **GREEDY)
        try:
            next(gen)
            with lock:
                started.append(i)
            release.wait(timeout=300)
        except Exception as e:  # noqa: BLE001 - ServerError expected, anything else reported
            with lock:
                refused.append(e)
        finally:
            gen.close()  # cancels the request on the server

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    # the surplus is refused at once; the others start as slots free up
    got_refusal = wait_for(lambda: len(refused) >= 1, timeout=120)
    release.set()
    for t in threads:
        t.join(timeout=300)
    assert got_refusal, "no request was refused"
    assert len(started) + len(refused) == n
    queue_full = [e for e in refused if isinstance(e, ServerError) and "queue is full" in e.message]
    assert queue_full, refused
    # Triton 2.51's HTTP generate endpoints answer every model error with 400; the error code the
    # model sends is UNAVAILABLE (newer Triton maps it to 503).
    assert all(e.status in (400, 503) for e in queue_full)
    assert wait_for(lambda: metric(scrape(triton_server), "alrkvd:kv_cache_blocks_used", model) == 0, timeout=60)
    s = scrape(triton_server)
    assert metric(s, "alrkvd:request_failure_total", model, reason="queue_full") >= len(queue_full)
    assert_serves(triton_server)


# ----------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------


def test_metrics_match_what_was_sent(triton_server):
    model = triton_server.model
    names = {
        "prompt": ("alrkvd:prompt_tokens_total", {}),
        "generated": ("alrkvd:generation_tokens_total", {}),
        "ttft": ("alrkvd:time_to_first_token_seconds_count", {}),
        "tpot": ("alrkvd:time_per_output_token_seconds_count", {}),
        "e2e": ("alrkvd:e2e_request_latency_seconds_count", {}),
        "e2e_sum": ("alrkvd:e2e_request_latency_seconds_sum", {}),
        "length": ("alrkvd:request_success_total", {"finished_reason": "length"}),
        "invalid": ("alrkvd:request_failure_total", {"reason": "invalid"}),
        "steps": ("alrkvd:iteration_tokens_total_count", {}),
        "step_tokens": ("alrkvd:iteration_tokens_total_sum", {}),
        "timed_steps": ("alrkvd:iteration_duration_seconds_count", {}),
        "step_seconds": ("alrkvd:iteration_duration_seconds_sum", {}),
    }

    def read():
        s = scrape(triton_server)
        return {k: metric(s, n, model, **ls) for k, (n, ls) in names.items()}

    before = read()
    results = [complete(PROMPT, url=triton_server.grpc_url, model=model, max_tokens=n, **GREEDY)
               for n in (5, 9)]
    with pytest.raises(ServerError):
        complete(PROMPT, url=triton_server.grpc_url, model=model, max_tokens=0)
    prompt = sum(r.num_input_tokens for r in results)
    expected = {
        "prompt": prompt,
        "generated": 14,
        "ttft": 2,
        "tpot": (5 - 1) + (9 - 1),
        "e2e": 2,
        "length": 2,
        "invalid": 1,
        # every prompt token once (in chunks; the last chunk's step samples the first token), then a decode step for
        # each later token; the refused request never runs
        "step_tokens": prompt + (5 - 1) + (9 - 1),
    }
    after = wait_for(lambda: (lambda a: a if all(a[k] - before[k] == v for k, v in expected.items()) else None)(read()),
                     timeout=10) or read()
    assert {k: after[k] - before[k] for k in expected} == expected
    assert (5 - 1) + (9 - 1) + 2 <= after["steps"] - before["steps"] <= (5 - 1) + (9 - 1) + prompt
    server_e2e = after["e2e_sum"] - before["e2e_sum"]
    client_e2e = sum(r.e2e_s for r in results)
    assert 0 < server_e2e <= client_e2e
    # each step's wall time, inside the two requests' (sent one after the other)
    assert after["timed_steps"] - before["timed_steps"] == after["steps"] - before["steps"]
    assert 0 < after["step_seconds"] - before["step_seconds"] <= client_e2e
    s = scrape(triton_server)
    assert metric(s, "alrkvd:kv_cache_blocks_total", model) > 0
    assert metric(s, "alrkvd:kv_cache_compression_ratio", model) > 0
    for gauge in ("alrkvd:num_requests_running", "alrkvd:num_requests_waiting", "alrkvd:kv_cache_usage_perc",
                  "alrkvd:num_preemptions_total", "alrkvd:prefix_cache_hit_tokens_total"):
        assert metric(s, gauge, model) >= 0


# ----------------------------------------------------------------------------------------------
# the server changes nothing: same greedy text as alrkvd-generate
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["smollm2", "smollm2_moe"])
def test_greedy_output_equals_alrkvd_generate(triton_server, model):
    """alrkvd-generate with the model's source and KV format (config.pbtxt) gives the server's greedy text,
    over HTTP and over gRPC."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    if model not in triton_server.models:
        pytest.fail(f"{model} is not served (ALRKVD_TEST_MODELS={os.environ.get('ALRKVD_TEST_MODELS')!r})")
    root = Path(__file__).resolve().parents[2]
    config = requests.get(f"http://{triton_server.http_url}/v2/models/{model}/config",
                          timeout=10, headers=CLOSE).json()
    params = {k: v["string_value"] for k, v in config["parameters"].items()}
    r = http_generate(triton_server, {"text_input": PROMPT, "exclude_input_in_output": True,
                                      "parameters": {"max_tokens": 24, **GREEDY}}, model=model)
    assert r.status_code == 200, r.text
    served = r.json()["text_output"]
    grpc = complete(PROMPT, url=triton_server.grpc_url, protocol="grpc", model=model, max_tokens=24, **GREEDY)
    assert grpc.text == served
    cmd = [sys.executable, "-m", "backend.generate", "--model", params["model"], "--prompt", PROMPT,
           "--max-tokens", "24", "--temperature", "0", "--ignore-eos", "--kv", params["kv_format"], "--json",
           "--weight-dtype", params.get("weight_dtype", "auto")]
    for key, value in json.loads(params.get("kv_options") or "{}").items():
        cmd += ["--kv-opt", f"{key}={value}"]
    env = dict(os.environ)
    if env.get("ALRKVD_TORCH_THREADS"):  # the server's thread count, for identical float sums
        env["OMP_NUM_THREADS"] = env["ALRKVD_TORCH_THREADS"]
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    offline = json.loads(out.stdout.strip().splitlines()[-1])
    assert offline["text"] == served
