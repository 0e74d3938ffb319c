"""The soak test (loadtest/soak.py, `make soak`): its pieces without a server (the cancel and bad-request
tenants, outcomes, the slope fit, every rule of the verdict, the samplers), then a 30 s soak through
`make soak` against the real tritonserver of tests/conftest.py, checked against its end conditions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from loadtest import metrics
from loadtest.metrics import RequestRecord
from loadtest.soak import (RecordTail, linear_fit, listening_pid, memory_slope, parse_prometheus, sample_processes,
                           verdict)
from loadtest.tenants import INVALID_KINDS, load_tenants, make_invalid, parse_tenants

REPO = Path(__file__).resolve().parents[2]


def rec(tenant="chat", protocol="grpc", expect=None, error_kind=None, pieces=(), **kw) -> RequestRecord:
    return RequestRecord(tenant=tenant, protocol=protocol, model="m", request_id="r", t_start=0.0,
                         piece_t=[0.1 * (i + 1) for i in range(len(pieces))], piece_tokens=list(pieces),
                         expect=expect, error_kind=error_kind, **kw)


# ------------------------------------------------------------------------------------------------
# Tenants that cancel and send bad requests
# ------------------------------------------------------------------------------------------------


def test_cancel_and_invalid_tenants_are_seeded_and_bounded():
    doc = {"seed": 3, "defaults": {"model": "m"}, "tenants": [
        {"name": "c", "max_tokens": {"dist": "uniform", "min": 2, "max": 6},
         "cancel": {"share": 0.5, "after_tokens": {"dist": "uniform", "min": 1, "max": 20}}},
        {"name": "bad", "invalid": ["empty_prompt", "unknown_parameter"], "cancel": {"share": 1.0}},
        {"name": "plain"},
    ]}
    c, bad, plain = parse_tenants(doc).tenants
    plan = [c.cancel_after(k, c.request(k)[1]) for k in range(400)]
    assert plan == [parse_tenants(doc).tenants[0].cancel_after(k, c.request(k)[1]) for k in range(400)]
    cancelled = [(k, n) for k, n in enumerate(plan) if n is not None]
    assert 150 < len(cancelled) < 250  # share 0.5
    assert all(1 <= n <= c.request(k)[1] - 1 for k, n in cancelled)  # while the request still runs
    assert c.cancel_after(0, 1) is None  # a one-token answer cannot be dropped mid-way
    assert [bad.invalid_kind(k) for k in range(4)] == ["empty_prompt", "unknown_parameter"] * 2
    assert all(bad.cancel_after(k, 16) is None for k in range(10))  # a bad request is refused, not dropped
    assert plain.cancel_after(0, 16) is None and plain.invalid_kind(0) is None
    d = parse_tenants(doc).to_dict()["tenants"]
    assert d[0]["cancel"]["share"] == 0.5 and d[1]["invalid"] == ["empty_prompt", "unknown_parameter"]
    assert d[2]["cancel"] is None and d[2]["invalid"] == []


@pytest.mark.parametrize("spec,match", [
    ({"cancel": {"share": 0}}, "share"),
    ({"cancel": {"when": 3}}, "cancel must be"),
    ({"cancel": 3}, "cancel must be"),
    ({"invalid": ["no_such_kind"]}, "unknown invalid kind"),
])
def test_cancel_and_invalid_validation(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_tenants({"tenants": [{"name": "x", "model": "m", **spec}]})


def test_make_invalid_changes_one_thing():
    base = ("Say hello to the river", 8, {"temperature": 0})
    seen = {}
    for kind in INVALID_KINDS:
        prompt, max_tokens, sampling = make_invalid(kind, *base)
        seen[kind] = (prompt != base[0], max_tokens != base[1], sampling != base[2])
        assert sum(seen[kind]) == 1, kind
    assert base[2] == {"temperature": 0}  # the tenant's own sampling is untouched
    assert make_invalid("empty_prompt", *base)[0] == ""
    assert len(make_invalid("prompt_too_long", *base)[0].split()) == 12000
    assert make_invalid("max_tokens_over_limit", *base)[1] == 100000
    assert make_invalid("unknown_parameter", *base)[2]["no_such_knob"] == 1
    with pytest.raises(ValueError, match="unknown invalid kind"):
        make_invalid("nope", *base)


def test_soak_tenants_file():
    cfg = load_tenants(REPO / "loadtest" / "tenants_soak.yaml")
    by = {t.name: t for t in cfg.tenants}
    assert all(t.model == "smollm2" and t.fixed_count for t in cfg.tenants)
    assert {t.protocol for t in cfg.tenants if t.cancel} == {"grpc", "http"}
    for proto in ("grpc", "http"):  # every kind of bad request over each protocol
        assert {k for t in cfg.tenants if t.protocol == proto for k in t.invalid} == set(INVALID_KINDS)
    # the seeded plan drops a stream of each protocol within the first few requests (the 30 s test relies on it)
    assert any(by["chat"].cancel_after(k, by["chat"].request(k)[1]) for k in range(4))
    assert any(by["summarize"].cancel_after(k, by["summarize"].request(k)[1]) for k in range(4))


GRPC_CLIENT_CHECK = textwrap.dedent("""
    import json
    from types import SimpleNamespace as NS
    import numpy as np
    from tritonclient.utils import InferenceServerException
    from loadtest import users

    class FakeTriton:
        # tritonclient.grpc.InferenceServerClient: answers each request with the scripted responses
        def __init__(self, script):
            self.script, self.calls = script, []
        def get_model_metadata(self, name, as_json):
            return {"inputs": [{"name": n, "shape": [1]} for n in ("text_input", "stream", "sampling_parameters")],
                    "outputs": [{"name": "text_output"}, {"name": "num_output_tokens"}]}
        def start_stream(self, callback):
            self.callback = callback
            self.calls.append("start")
        def stop_stream(self, cancel_requests=False):
            self.calls.append(f"stop(cancel={cancel_requests})")
        def close(self):
            self.calls.append("close")
        def async_stream_infer(self, model, inputs, request_id, parameters, enable_empty_final_response):
            for item in self.script.pop(0):
                if isinstance(item, str):
                    self.callback(None, InferenceServerException(item))
                    continue
                tokens, final = item
                params = {"triton_final_response": NS(bool_param=final)}
                out = {"text_output": np.array([b"x" * tokens], dtype=object),
                       "num_output_tokens": np.array([tokens], dtype=np.uint32)}
                response = NS(id=request_id, parameters=params, outputs=[NS(name=n) for n in out] if tokens else [])
                self.callback(NS(get_response=lambda r=response: r, as_numpy=out.get), None)

    def run(script, cancel_after={}):  # request number -> tokens after which the client drops it
        client = users.GrpcStreamClient("fake:1")
        client._client = fake = FakeTriton(script)
        results = []
        for i in range(len(script)):
            got = []
            def on_piece(p, limit=cancel_after.get(i)):
                got.append(p.tokens)
                if limit is not None and sum(got) >= limit:
                    raise users.ClientCancel(sum(got))
            try:
                client.generate("m", "hi", 4, {}, f"r{i}", on_piece)
                results.append("ok")
            except users.LLMRequestError as e:
                results.append(e.kind)
            except users.ClientCancel:
                results.append("cancelled")
        client.close()
        return {"results": results, "calls": fake.calls}

    print(json.dumps({
        # an error answer ends its request; the stream stays, and is closed without cancelling
        "error": run([["unknown sampling parameter"], [(1, False), (0, True)]]),
        # the client drops a running request: its stream is cancelled, a new one serves the next
        "drop": run([[(1, False), (1, False)], [(2, True)]], cancel_after={0: 1}),
        # a drop decided on the final piece cancels nothing: the request had ended
        "drop_on_final": run([[(1, False), (1, True)]], cancel_after={0: 2}),
    }))
""")


def test_grpc_client_cancels_a_stream_only_to_abandon_a_request():
    """Triton 2.51 leaks a call's state (an fd, a model reference) when a stream is cancelled just after
    a final response: the load-test client cancels only a request it abandons mid-way."""
    out = subprocess.run([sys.executable, "-c", GRPC_CLIENT_CHECK], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["error"] == {"results": ["http", "ok"], "calls": ["start", "stop(cancel=False)", "close"]}
    assert r["drop"] == {"results": ["cancelled", "ok"],
                         "calls": ["start", "stop(cancel=True)", "start", "stop(cancel=False)", "close"]}
    assert r["drop_on_final"] == {"results": ["cancelled"], "calls": ["start", "stop(cancel=False)", "close"]}


# ------------------------------------------------------------------------------------------------
# Outcomes
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("r,outcome,expected", [
    (rec(pieces=[1, 1]), "ok", True),
    (rec(error_kind=metrics.TIMEOUT), "timeout", False),
    (rec(expect="cancel", error_kind=metrics.CANCELLED, pieces=[1]), "cancelled", True),
    (rec(expect="cancel", pieces=[1, 1]), "ok", True),  # it ended before the client left
    (rec(expect="cancel", error_kind=metrics.TRUNCATED, pieces=[1]), "truncated", False),
    (rec(error_kind=metrics.CANCELLED, pieces=[1]), "cancelled", False),  # not built to be dropped
    (rec(expect="invalid", error_kind=metrics.HTTP), "refused", True),
    (rec(expect="invalid", pieces=[1]), "accepted", False),
    (rec(expect="invalid", error_kind=metrics.STREAM_ERROR, pieces=[1]), "stream_error", False),
    (rec(expect="invalid", error_kind=metrics.CONNECT), "connect", False),
    (rec(error_kind=metrics.HTTP), "http", False),
])
def test_outcome_and_expected(r, outcome, expected):
    assert metrics.outcome_of(r) == outcome
    assert metrics.expected(r) is expected


def test_record_tail_reads_lines_as_they_are_appended(tmp_path):
    path = tmp_path / "requests.jsonl"
    tail = RecordTail(path)
    tail.poll()  # no file yet
    lines = [json.dumps(r.to_dict()) for r in (
        rec(pieces=[1]), rec(expect="cancel", error_kind=metrics.CANCELLED, pieces=[1]),
        rec(protocol="http", expect="invalid", error_kind=metrics.HTTP, invalid_kind="empty_prompt"),
        rec(expect="invalid", pieces=[1], invalid_kind="wrong_type"), rec(error_kind=metrics.TIMEOUT))]
    text = "\n".join(lines) + "\n"
    cut = len(lines[0]) + 10  # the second line half written
    path.write_text(text[:cut])
    tail.poll()
    assert tail.total == 1
    with path.open("a") as f:
        f.write(text[cut:])
    tail.poll()
    assert tail.by_outcome == Counter({"ok": 1, "cancelled": 1, "refused": 1, "accepted": 1, "timeout": 1})
    assert tail.unexpected == Counter({"invalid:accepted": 1, "ordinary:timeout": 1})
    assert tail.invalid_sent == 2
    assert tail.invalid_by_kind == Counter({"http:empty_prompt:refused": 1, "grpc:wrong_type:accepted": 1})


# ------------------------------------------------------------------------------------------------
# Server observation
# ------------------------------------------------------------------------------------------------


def test_parse_prometheus():
    text = ('# HELP x y\n# TYPE x counter\nalrkvd:kv_cache_blocks_used{model="m",version="1"} 3\n'
            'alrkvd:request_failure_total{model="m",reason="invalid",version="1"} 7\nnv_up 1\n\n')
    assert parse_prometheus(text) == [
        ("alrkvd:kv_cache_blocks_used", {"model": "m", "version": "1"}, 3.0),
        ("alrkvd:request_failure_total", {"model": "m", "reason": "invalid", "version": "1"}, 7.0),
        ("nv_up", {}, 1.0)]


def test_sample_processes_and_listening_pid():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        procs = {p["pid"]: p for p in sample_processes(os.getpid())}
        assert set(procs) >= {os.getpid(), child.pid}
        me = procs[os.getpid()]
        assert me["rss_mb"] > 10 and me["fds"] >= 3 and me["threads"] >= 1
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            assert listening_pid(s.getsockname()[1]) == os.getpid()
    finally:
        child.kill()
        child.wait()


def test_settle_waits_for_idle_and_the_baseline(monkeypatch):
    from loadtest import soak

    gauges = iter([3, 0, 0, 0, 0, 0, 0, 0, 0, 0])  # KV blocks in use, one poll after another
    threads = iter([62, 62, 61, 61, 60, 60, 60, 60, 60, 60])  # a transient thread goes away
    monkeypatch.setattr(soak, "server_metrics", lambda url, models: {
        "kv_blocks_used": next(gauges), "running": 0, "waiting": 0})
    monkeypatch.setattr(soak, "sample_processes", lambda pid: [{"fds": 70, "threads": next(threads)}])
    monkeypatch.setattr(soak.time, "sleep", lambda s: None)
    sampler = soak.Sampler(1, "http://x/metrics", ["m"], RecordTail(Path("/nonexistent")))
    r = soak.settle(sampler, {"fds": 70, "threads": 60}, timeout_s=60)
    assert r["idle"] and r["back_to_baseline"]
    assert next(threads) == 60 and next(gauges) == 0  # it stopped at the fifth poll
    # a leak: the threads never come back; the settle gives up at its timeout and says so
    monkeypatch.setattr(soak, "server_metrics", lambda url, models: {"kv_blocks_used": 0, "running": 0, "waiting": 0})
    monkeypatch.setattr(soak, "sample_processes", lambda pid: [{"fds": 70, "threads": 61}])
    r = soak.settle(sampler, {"fds": 70, "threads": 60}, timeout_s=0)
    assert r["idle"] is False and r["back_to_baseline"] is False


def test_soak_module_stays_out_of_gevent():
    """The soak process primes over gRPC and samples on a thread: Locust's gevent patching would hang both."""
    code = "import sys, loadtest.soak; print('gevent' in sys.modules, 'locust' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


# ------------------------------------------------------------------------------------------------
# The rules
# ------------------------------------------------------------------------------------------------


def test_linear_fit_and_memory_slope():
    assert linear_fit([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx((2.0, 1.0))
    assert linear_fit([0, 1], [0, 1]) is None and linear_fit([1, 1, 1], [0, 1, 2]) is None
    # +10 MB per hour under load, a step during the warm-up, idle samples ignored
    samples = [sample(t, 1000 + 10 * t / 3600 + (50 if t >= 60 else 0), phase="load") for t in range(0, 3601, 10)]
    samples.append(sample(3700, 5000, phase="after"))
    steady = memory_slope(samples, 120, 3600)
    assert steady["mb_per_h"] == pytest.approx(10.0) and steady["points"] == 349
    assert steady["growth_mb"] == pytest.approx(10.0 * 3480 / 3600)
    assert memory_slope(samples, 1800, 3600)["mb_per_h"] == pytest.approx(10.0)
    assert memory_slope(samples, 5000, 6000)["mb_per_h"] is None


def sample(t, rss=1000.0, phase="load", kv=0, fds=70, threads=60, invalid=0, pids=((1, "tritonserver"), (2, "stub"))):
    mem = {"total": rss, "server": 40.0, "stubs": rss - 40.0}
    return {"t": t, "phase": phase, "rss_mb": mem, "anon_mb": mem,
            "fds": fds, "threads": threads,
            "processes": [{"pid": p, "name": n, "rss_mb": 1.0, "fds": 1, "threads": 1} for p, n in pids],
            "server": {"kv_blocks_used": kv, "kv_blocks_total": 278, "running": 0, "waiting": 0,
                       "success": {"length": 0}, "failure": {"invalid": invalid}}}


def good_tail() -> RecordTail:
    tail = RecordTail(Path("/nonexistent"))
    for r in (rec(pieces=[1, 1]), rec(expect="cancel", error_kind=metrics.CANCELLED, pieces=[1]),
              rec(expect="invalid", error_kind=metrics.HTTP, invalid_kind="empty_prompt")):
        tail.add(r)
    return tail


def judge(after=None, before=None, load=None, tail=None, duration=600.0, max_slope=50.0, window=300.0):
    before = before or sample(0, phase="before")
    after = after or sample(duration + 10, phase="after", invalid=1)
    load = load if load is not None else [sample(t, kv=5, fds=76, threads=61) for t in range(10, int(duration) + 1, 10)]
    return verdict(before, after, [before, *load, after], tail or good_tail(), duration, 60.0, max_slope, window)


def test_verdict_passes_a_clean_soak():
    v = judge()
    assert v["pass"], v["checks"]
    assert set(v["checks"]) == {"kv_blocks_free", "fds", "threads", "outcomes", "bad_requests", "served",
                                "same_processes", "memory"}
    assert v["memory_mb"]["judged"] and v["memory_mb"]["slope_second_half"]["mb_per_h"] == pytest.approx(0.0)
    assert v["kv_blocks"] == {"before": 0, "after": 0, "max_under_load": 5, "total": 278}
    assert v["fds"] == {"before": 70, "after": 70, "max_under_load": 76}
    assert v["requests"]["by_outcome"] == {"ok": 1, "cancelled": 1, "refused": 1}
    assert v["server_counters"]["failure"] == {"invalid": 1}


@pytest.mark.parametrize("change,failing", [
    ({"after": sample(610, phase="after", invalid=1, kv=2)}, "kv_blocks_free"),
    ({"after": sample(610, phase="after", invalid=1, fds=71)}, "fds"),
    ({"after": sample(610, phase="after", invalid=1, threads=61)}, "threads"),
    ({"after": sample(610, phase="after", invalid=0)}, "bad_requests"),
    ({"after": sample(610, phase="after", invalid=1, pids=((1, "tritonserver"), (3, "stub")))}, "same_processes"),
    ({"load": [sample(t, rss=1000 + t / 10) for t in range(10, 601, 10)]}, "memory"),  # 360 MB/h
])
def test_verdict_names_the_rule_that_fails(change, failing):
    v = judge(**change)
    assert not v["pass"]
    assert [k for k, c in v["checks"].items() if not c["pass"]] == [failing]


def test_verdict_unexpected_outcomes_and_nothing_served():
    tail = good_tail()
    tail.add(rec(error_kind=metrics.TIMEOUT))
    tail.add(rec(expect="invalid", pieces=[1]))
    v = judge(after=sample(610, phase="after", invalid=2), tail=tail)
    assert [k for k, c in v["checks"].items() if not c["pass"]] == ["outcomes"]
    assert v["requests"]["unexpected"] == {"ordinary:timeout": 1, "invalid:accepted": 1}
    empty = RecordTail(Path("/nonexistent"))
    v = judge(after=sample(610, phase="after"), tail=empty)
    assert [k for k, c in v["checks"].items() if not c["pass"]] == ["served"]


def test_verdict_memory_not_judged_on_a_short_window():
    load = [sample(t, rss=1000 + t) for t in range(5, 46, 5)]  # 3.6 GB/h over 45 s: reported, not judged
    v = judge(after=sample(50, phase="after", invalid=1), load=load, duration=45.0)
    assert v["pass"] and v["checks"]["memory"]["judged"] is False
    assert v["memory_mb"]["slope_second_half"]["mb_per_h"] == pytest.approx(3600.0)


# ------------------------------------------------------------------------------------------------
# A short soak against the real server
# ------------------------------------------------------------------------------------------------


def test_make_soak_30s(triton_server, tmp_path):
    """`make soak` for 30 s against the session's server: its end conditions, its files."""
    srv = triton_server
    out = tmp_path / "soak"
    args = (f"--host http://{srv.http_url} --grpc-url {srv.grpc_url} --metrics-url {srv.metrics_url} "
            f"--duration 30s --interval 3s --settle 30s --out {out}")
    # -o: never let this test run the Makefile's pip setup (CI's `make test` has just done it).
    # PY: the interpreter running the tests (a worktree may have no .venv of its own).
    cmd = ["make", "--no-print-directory", "-o", ".venv/.alrkvd-setup", "-o", "setup", "soak", f"PY={sys.executable}",
           f"SOAK_ARGS={args}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    log = proc.stdout[-4000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, log
    assert "soak: PASS" in proc.stdout, log
    doc = json.loads((out / "soak.json").read_text())
    s, samples = doc["summary"], doc["samples"]
    assert s["pass"] and all(c["pass"] for c in s["checks"].values()), s["checks"]
    assert s["checks"]["memory"]["judged"] is False  # 30 s is too short to judge a slope
    # every KV block free after the load, nothing grew
    assert s["kv_blocks"]["after"] == 0 and s["kv_blocks"]["max_under_load"] > 0
    assert s["fds"]["after"] <= s["fds"]["before"] and s["threads"]["after"] <= s["threads"]["before"]
    # the mix happened: served, dropped by the client, refused; nothing else
    by = s["requests"]["by_outcome"]
    assert by.get("ok", 0) >= 2 and by.get("cancelled", 0) >= 1 and by.get("refused", 0) >= 2, by
    assert set(by) <= {"ok", "cancelled", "refused"} and not s["requests"]["unexpected"]
    assert {k.split(":")[0] for k in s["requests"]["invalid_by_kind"]} == {"grpc", "http"}
    assert s["server_counters"]["failure"]["invalid"] == s["requests"]["invalid_sent"] == by["refused"]
    # the time series: a baseline, samples under load every ~5 s, then the settled server
    phases = [x["phase"] for x in samples]
    assert phases[0] == "before" and phases[-1] == "after" and phases.count("load") >= 7
    for x in samples:
        assert x["rss_mb"]["total"] > 100 and x["fds"] > 0 and x["threads"] > 0
        assert {p["name"] for p in x["processes"]} >= {"tritonserver", "triton_python_backend_stub"}
    assert (out / "soak.png").stat().st_size > 10_000
    assert (out / "requests.jsonl").is_file() and (out / "report.md").is_file()
