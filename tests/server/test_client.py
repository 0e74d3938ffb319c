"""alrkvd-client and the client API: framing and latency bookkeeping, and the CLI on a real server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from client import Completion, ServerError, complete
from client.http_stream import _error_text


def test_completion_latencies():
    c = Completion(text="abc", pieces=["a", "b", "c"], finish_reason="length", num_input_tokens=3,
                   num_output_tokens=5, ttft_s=0.5, itl_s=[0.1, 0.3], e2e_s=1.3)
    assert c.mean_itl_s == pytest.approx(0.2)
    assert c.time_per_output_token_s == pytest.approx(0.2)  # (1.3 - 0.5) / 4


def test_http_error_bodies():
    assert _error_text('data: {"error":"bad max_tokens"}\n\n') == "bad max_tokens"
    assert _error_text('{"error":"queue is full"}') == "queue is full"
    assert _error_text("plain") == "plain"
    assert str(ServerError("x", 503)) == "HTTP 503: x"


def test_unknown_protocol():
    with pytest.raises(ValueError, match="protocol"):
        complete("hi", protocol="smtp")


def test_unreachable_server_is_reported():
    out = subprocess.run([sys.executable, "-m", "client.cli", "--url", "127.0.0.1:9", "--protocol", "http", "hi"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "cannot reach" in out.stderr


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_cli_streams_and_prints_latencies(triton_server, protocol):
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    out = subprocess.run([sys.executable, "-m", "client.cli", "--url", url, "--protocol", protocol,
                          "--model", triton_server.model, "-n", "12", "--sampling", '{"ignore_eos": true}',
                          "Write a haiku about caches"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    for label in ("time to first token", "inter-token latency", "tokens"):
        assert label in out.stderr
    assert "12 out (length)" in out.stderr


def test_cli_json_and_server_errors(triton_server):
    base = [sys.executable, "-m", "client.cli", "--url", triton_server.grpc_url, "--model", triton_server.model]
    out = subprocess.run(base + ["--json", "-n", "4", "--sampling", '{"ignore_eos": true}', "Hi"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["num_output_tokens"] == 4 and result["finish_reason"] == "length"
    assert result["ttft_s"] > 0
    bad = subprocess.run(base + ["-n", "-1", "Hi"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "max_tokens" in bad.stderr
    late = subprocess.run(base + ["--json", "-n", "400", "--deadline", "0.5", "--sampling", '{"ignore_eos": true}', "Hi"],
                          capture_output=True, text=True, timeout=300)
    assert late.returncode == 0, late.stderr
    result = json.loads(late.stdout)
    assert result["finish_reason"] == "timeout" and result["num_output_tokens"] < 400


def test_cli_asks_the_moe_by_default(triton_server):
    """Without --model the client asks the deployment's default model, the SmolLM2 MoE (smollm2_moe)."""
    if "smollm2_moe" not in triton_server.models:
        pytest.fail("smollm2_moe is not served (ALRKVD_TEST_MODELS)")
    prompt, greedy = "What is the capital of France?", {"max_tokens": 8, "temperature": 0}
    out = subprocess.run([sys.executable, "-m", "client.cli", "--url", triton_server.grpc_url, "--json", "-n", "8",
                          "-t", "0", prompt], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    moe = complete(prompt, url=triton_server.grpc_url, model="smollm2_moe", **greedy).text
    dense = complete(prompt, url=triton_server.grpc_url, model="smollm2", **greedy).text
    assert json.loads(out.stdout)["text"] == moe != dense
