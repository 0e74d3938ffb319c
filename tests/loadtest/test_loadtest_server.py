"""Load-test suite against the real tritonserver with the default model (tests/conftest.py's
`triton_server`): the SSE parser on the server's own bytes, an in-process Locust run (Locust's
library API, in a child interpreter so gevent's monkey-patching stays out of this pytest process)
checked against the server's Prometheus counters, and the `make loadtest` smoke run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import requests
import yaml

from loadtest.metrics import HTTP, derive
from loadtest.records import read_records
from loadtest.report import PLOTS, write_report
from loadtest.sse import SSEParser, decode_triton_event

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------


def metric_sum(metrics_url: str, name: str, model: str, **labels) -> float:
    """Sum of a Prometheus family's samples for `model` (and `labels`) on the server's /metrics."""
    text = requests.get(metrics_url, timeout=10).text
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if not m:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if found.get("model") == model and all(found.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def counters(server) -> dict:
    u, m = server.metrics_url, server.model
    return {
        "tokens": metric_sum(u, "alrkvd:generation_tokens_total", m),
        "success": metric_sum(u, "alrkvd:request_success_total", m),
        "invalid": metric_sum(u, "alrkvd:request_failure_total", m, reason="invalid"),
    }


def settled_counters(server, timeout: float = 30.0) -> dict:
    """Counters once the server is idle and they stop moving (its metrics thread lags ~0.5 s)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        running = metric_sum(server.metrics_url, "alrkvd:num_requests_running", server.model)
        now = counters(server)
        if running == 0 and now == last:
            return now
        if time.monotonic() > deadline:
            raise AssertionError(f"server counters did not settle: running={running}, {now} vs {last}")
        last = now
        time.sleep(1.0)


def stream_raw(http_url: str, body: dict, model: str) -> tuple[int, list[tuple[float, bytes]]]:
    chunks = []
    with requests.post(f"http://{http_url}/v2/models/{model}/generate_stream", json=body, stream=True,
                       timeout=120) as r:
        for chunk in r.iter_content(chunk_size=None):
            chunks.append((time.perf_counter(), chunk))
        return r.status_code, chunks


def parse(chunks: list[tuple[float, bytes]]):
    p = SSEParser()
    events = [e for t, c in chunks for e in p.feed(c, t)]
    assert not p.partial
    return events


# ------------------------------------------------------------------------------------------------
# The SSE parser on real server output
# ------------------------------------------------------------------------------------------------


def test_sse_parser_on_real_server_output(triton_server):
    srv = triton_server
    before = settled_counters(srv)
    body = {"text_input": "Write a short poem about the sea.", "stream": True,
            "sampling_parameters": json.dumps({"max_tokens": 12, "temperature": 0, "ignore_eos": True}),
            "exclude_input_in_output": True, "return_finish_reason": True,
            "return_num_input_tokens": True, "return_num_output_tokens": True}
    status, chunks = stream_raw(srv.http_url, body, srv.model)
    assert status == 200
    events = parse(chunks)
    decoded = [decode_triton_event(e) for e in events]
    assert decoded and all(d.error is None for d in decoded)
    assert sum(d.num_output_tokens for d in decoded) == 12
    assert decoded[-1].finish_reason == "length"
    assert all(d.finish_reason in ("None", None) for d in decoded[:-1])
    assert decoded[0].num_input_tokens and decoded[0].num_input_tokens > 5
    assert "".join(d.text for d in decoded).strip()
    times = [d.t for d in decoded]
    assert times == sorted(times) and set(times) <= {t for t, _ in chunks}
    # The same bytes cut anywhere give the same events.
    raw = b"".join(c for _, c in chunks)
    for size in (1, 3, 17, len(raw)):
        again = parse([(0.0, raw[i:i + size]) for i in range(0, len(raw), size)])
        assert [e.data for e in again] == [e.data for e in events]
    # The server counted exactly the tokens the stream reported.
    after = settled_counters(srv)
    assert after["tokens"] - before["tokens"] == 12
    assert after["success"] - before["success"] == 1
    # A request refused at once: 400, with the error framed as an SSE event.
    bad = dict(body, sampling_parameters=json.dumps({"max_tokens": 4, "no_such_knob": 1}))
    status, chunks = stream_raw(srv.http_url, bad, srv.model)
    assert status == 400
    (err,) = [decode_triton_event(e) for e in parse(chunks + [(0.0, b"\n\n")])]
    assert "no_such_knob" in err.error


# ------------------------------------------------------------------------------------------------
# In-process Locust run
# ------------------------------------------------------------------------------------------------

TENANTS = {
    "seed": 7,
    "defaults": {"model": "smollm2", "sampling": {"temperature": 0, "ignore_eos": True}},
    "tenants": [
        {"name": "chat", "fixed_count": 1, "protocol": "grpc", "max_tokens": 8,
         "prompt": {"words": {"dist": "uniform", "min": 8, "max": 16}, "prefix": "Answer briefly: "},
         "slo": {"ttft_ms": 60000, "tpot_ms": 60000}},
        {"name": "assistant", "fixed_count": 1, "protocol": "openai", "max_tokens": 8,
         "prompt": {"words": {"dist": "uniform", "min": 8, "max": 16}, "prefix": "Answer briefly: "},
         "slo": {"ttft_ms": 60000, "tpot_ms": 60000}},
        {"name": "summarize", "fixed_count": 1, "protocol": "http", "max_tokens": 8,
         "prompt": {"words": {"dist": "uniform", "min": 60, "max": 100}, "prefix": "Summarize: "},
         "slo": {"ttft_ms": 1, "tpot_ms": 60000}},  # unmeetable TTFT: goodput 0
        # Refused by the server (unknown sampling key): every request is an "http" failure.
        {"name": "rejected", "fixed_count": 1, "protocol": "http", "max_tokens": 4, "think_time_s": 1.0,
         "sampling": {"temperature": 0, "no_such_knob": 1}},
    ],
}

# (os._exit: once, with every output written, the gevent-patched process did not exit in 400 s)
INPROCESS = textwrap.dedent("""
    import os, sys
    from loadtest.run import run_inprocess
    code = run_inprocess(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
""")


def test_inprocess_locust_run_per_tenant_metrics(triton_server, tmp_path):
    srv = triton_server
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(yaml.safe_dump(dict(TENANTS, defaults=dict(TENANTS["defaults"], model=srv.model))))
    out = tmp_path / "run"
    args = ["--host", f"http://{srv.http_url}", "--grpc-url", srv.grpc_url, "--openai-url", srv.openai_url,
            "--tenants", str(tenants), "--shape", "fixed", "--users", "4", "--run-time", "16s", "--warmup", "3s",
            "--stop-timeout", "120", "--out-dir", str(out), "--loglevel", "WARNING"]
    before = settled_counters(srv)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", INPROCESS, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=400)
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr[-3000:]  # 1: the "rejected" tenant's failures
    after = settled_counters(srv)
    records = read_records(out / "requests.jsonl")
    by = {n: [r for r in records if r.tenant == n] for n in ("chat", "assistant", "summarize", "rejected")}
    assert {r.tenant for r in records} == set(by)

    # Good tenants: every request succeeded over its own protocol, with consistent timings.
    for name, proto in (("chat", "grpc"), ("summarize", "http")):
        recs = by[name]
        assert len([r for r in recs if not r.warmup]) >= 1, name
        for r in recs:
            assert r.ok, (name, r.error_kind, r.error)
            assert r.protocol == proto and r.tokens_from_server
            m = derive(r)
            assert 0 < m.ttft <= m.e2e <= elapsed
            assert m.output_tokens == 8 == r.max_tokens and r.finish_reason == "length"
            assert len(m.itl) == sum(1 for n in r.piece_tokens if n > 0) - 1
            assert m.tpot == pytest.approx((m.e2e - m.ttft) / 7)
            assert r.num_input_tokens >= r.prompt_words // 2
    # The same load through the OpenAI front: a token per streamed chunk, the prompt's tokens from `usage`.
    assert len([r for r in by["assistant"] if not r.warmup]) >= 1
    for r in by["assistant"]:
        assert r.ok and r.protocol == "openai" and not r.tokens_from_server, (r.error_kind, r.error)
        assert derive(r).output_tokens == 8 and r.finish_reason == "length" and r.num_input_tokens >= r.prompt_words // 2
    # Refused tenant: failures of kind "http" carrying the server's message, no tokens.
    assert by["rejected"] and all(r.error_kind == HTTP and "no_such_knob" in r.error and not r.piece_t
                                  for r in by["rejected"])

    # Token and request counts equal the server's own counters over the run.
    ok = [r for r in records if r.ok]
    assert after["tokens"] - before["tokens"] == sum(sum(r.piece_tokens) for r in ok)
    assert after["success"] - before["success"] == len(ok)
    assert after["invalid"] - before["invalid"] == len(by["rejected"])

    # The exact report: per-tenant metrics exist and agree with the raw records.
    summary = write_report(out)
    for name in ("chat", "assistant", "summarize"):
        s = summary["tenants"][name]
        measured = [r for r in by[name] if not r.warmup]
        assert s["requests"] == s["ok"] == len(measured) and s["failed"] == 0
        assert s["output_tokens"] == 8 * len(measured)
        for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
            assert s[key]["count"] == len(measured) and s[key]["p50"] > 0, (name, key)
        assert s["itl_ms"]["count"] >= len(measured)
        assert s["ttft_ms"]["max"] <= s["e2e_ms"]["max"] and s["ttft_ms"]["min"] <= s["e2e_ms"]["min"]
        assert s["output_throughput_tok_s"] > 0
    assert summary["tenants"]["chat"]["goodput"]["share"] == 1.0
    assert summary["tenants"]["summarize"]["goodput"]["share"] == 0.0
    rej = summary["tenants"]["rejected"]
    assert rej["failures"]["http"] == rej["requests"] > 0 and rej["goodput"]["share"] == 0.0
    assert summary["overall"]["failures"]["http"] == rej["requests"]

    # Locust's live statistics, named by tenant and metric.
    live = {(e["type"], e["name"]): e for e in json.loads((out / "locust_stats.json").read_text())}
    for key in [("grpc", "chat"), ("TTFT", "chat"), ("ITL", "chat"), ("TPOT", "chat"),
                ("sse", "summarize"), ("TTFT", "summarize"), ("ITL", "summarize"), ("openai", "assistant"),
                ("TTFT", "assistant"), ("ITL", "assistant")]:
        assert key in live and live[key]["num_requests"] >= 1, key
    assert live[("sse", "rejected")]["num_failures"] == live[("sse", "rejected")]["num_requests"] > 0
    assert live[("grpc", "chat")]["total_content_length"] == 8 * live[("grpc", "chat")]["num_requests"]


# ------------------------------------------------------------------------------------------------
# `make loadtest` smoke run
# ------------------------------------------------------------------------------------------------


def test_make_loadtest_smoke(triton_server, tmp_path):
    srv = triton_server
    out = tmp_path / "smoke"
    # -o: never let this test run the Makefile's pip setup (CI's `make test` has just done it).
    cmd = ["make", "--no-print-directory", "-o", ".venv/.alrkvd-setup", "-o", "setup", "loadtest",
           f"LOADTEST_ARGS=--host http://{srv.http_url} --grpc-url {srv.grpc_url} --server never --out {out} "
           f"--metrics-url {srv.metrics_url} --run-time 12s"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"report: {out / 'report.md'}" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["tenants"]) == {"chat", "summarize"}
    assert summary["overall"]["ok"] >= 2 and summary["overall"]["failed"] == 0
    for name, s in summary["tenants"].items():
        assert s["failed"] == 0, name
        for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            assert set(s[key]) >= {"count", "mean", "p50", "p90", "p95", "p99"}, (name, key)
            if s["ok"]:  # a slow machine may finish no measured `summarize` request in 20 s
                assert s[key]["p50"] > 0, (name, key)
        assert 0.0 <= (s["goodput"]["share"] or 0.0) <= 1.0
    assert summary["tenants"]["chat"]["ok"] >= 1 and summary["tenants"]["chat"]["output_throughput_tok_s"] > 0
    assert summary["run"]["plan"]["shape"] == "fixed" and summary["run"]["warmup_excluded"] >= 1
    records = read_records(out / "requests.jsonl")
    assert len(records) == summary["run"]["requests_recorded"]
    md = (out / "report.md").read_text()
    assert md.startswith("# Load test report") and "| chat |" in md and "| summarize |" in md
    from PIL import Image

    for fname in PLOTS.values():
        with Image.open(out / fname) as im:
            im.verify()
            assert im.format == "PNG" and im.size[0] > 300
    assert (out / "locust.html").stat().st_size > 0 and (out / "run.json").is_file()
    # the server's engine steps over the run, from /metrics: their tokens hold every prompt and generated token
    steps = json.loads((out / "server_steps.json").read_text())
    generated = sum(s["output_tokens"] for s in summary["tenants"].values())
    assert steps["steps"] > 0 and steps["mean_tokens"] * steps["steps"] >= generated
    assert steps["mean_ms"] > 0
    assert steps["tokens_per_s"] == pytest.approx(steps["mean_tokens"] / steps["mean_ms"] * 1e3)
    assert steps["share_at_most"]["inf"] == 1.0 and "engine: " in proc.stdout
    # and its readings through the 12 s run, a second apart, never counting fewer steps than the one before
    counts = [r["steps"]["count"] for _, r in steps["readings"]]
    assert len(counts) >= 8 and counts == sorted(counts) and counts[-1] > counts[0]
    # the prompt tokens the server admitted hold every measured request's; none came from the cache (off here)
    sent = sum(round(s["input_tokens_per_request"]["mean"] * s["input_tokens_per_request"]["count"])
               for s in summary["tenants"].values() if s["input_tokens_per_request"]["count"])
    assert steps["prompt_tokens"] >= sent > 0 and steps["prefix_cache_hit_tokens"] == 0
