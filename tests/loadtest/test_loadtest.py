"""Load-test suite, fast part: metric functions on hand-made timings, the SSE parser on hand-made
streams, tenants, the raw file and the report. No server, and nothing here imports Locust (which
would monkey-patch this pytest process for gevent) except through a child interpreter."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from loadtest import compare, metrics
from loadtest.metrics import RequestRecord, derive, percentile, summarize
from loadtest.records import JsonlWriter, read_records, write_run_meta
from loadtest.report import PLOTS, build_summary, write_report
from loadtest.sse import SSEParser, decode_triton_event
from loadtest.tenants import Dist, corpus_words, load_tenants, parse_tenants

REPO = Path(__file__).resolve().parents[2]


def rec(piece_t, piece_tokens, t_end=None, tenant="chat", t_start=1000.0, **kw) -> RequestRecord:
    return RequestRecord(tenant=tenant, protocol="grpc", model="m", request_id=f"r{random.random()}",
                         t_start=t_start, piece_t=list(piece_t), piece_tokens=list(piece_tokens), t_end=t_end, **kw)


# ------------------------------------------------------------------------------------------------
# Per-request metrics
# ------------------------------------------------------------------------------------------------


def test_derive_hand_made_timings():
    m = derive(rec([0.5, 0.6, 0.8, 0.85], [1, 1, 2, 1], t_end=0.9))
    assert m.ok and m.output_tokens == 5
    assert m.ttft == pytest.approx(0.5)
    assert m.itl == pytest.approx((0.1, 0.2, 0.05))  # one gap per piece, a 2-token piece is one gap
    assert m.e2e == pytest.approx(0.9)
    assert m.tpot == pytest.approx((0.9 - 0.5) / 4)
    assert m.tokens_per_s_user == pytest.approx(10.0)


def test_derive_ignores_empty_pieces_for_ttft_and_itl():
    # A first piece without tokens (nothing decoded yet) and an empty final response.
    m = derive(rec([0.2, 0.4, 0.7, 0.75], [0, 1, 1, 0], t_end=0.75))
    assert m.ttft == pytest.approx(0.4)
    assert m.itl == pytest.approx((0.3,))
    assert m.e2e == pytest.approx(0.75)
    assert m.tpot == pytest.approx(0.35)


def test_derive_e2e_defaults_and_single_token():
    m = derive(rec([0.3], [1]))
    assert m.e2e == pytest.approx(0.3) and m.ttft == pytest.approx(0.3)
    assert m.tpot is None and m.tokens_per_s_user is None and m.itl == ()


def test_derive_failed_request():
    m = derive(rec([0.3, 0.4], [1, 1], t_end=0.5, error_kind=metrics.STREAM_ERROR, error="boom"))
    assert not m.ok and m.e2e is None and m.tpot is None
    assert m.ttft == pytest.approx(0.3)  # what arrived is still known


def test_derive_rejects_inconsistent_timings():
    with pytest.raises(ValueError, match="monotonic"):
        derive(rec([0.5, 0.4], [1, 1]))
    with pytest.raises(ValueError, match="token counts"):
        derive(rec([0.5, 0.6], [1]))


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
def test_percentile_matches_numpy_exactly(n):
    rng = np.random.default_rng(n)
    xs = rng.exponential(50.0, size=n).tolist()
    for q in (0, 1, 50, 90, 95, 99, 99.9, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12, abs=1e-12)


def test_percentile_edges():
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_distribution_in_ms():
    d = metrics.distribution([0.1, 0.2, 0.3, 0.4], 1000.0)
    assert d["count"] == 4 and d["mean"] == pytest.approx(250.0)
    assert d["p50"] == pytest.approx(250.0) and d["p99"] == pytest.approx(397.0)
    assert d["min"] == pytest.approx(100.0) and d["max"] == pytest.approx(400.0)
    assert metrics.distribution([])["p50"] is None


def test_goodput_slos():
    fast = derive(rec([0.1, 0.2, 0.3], [1, 1, 1], t_end=0.3))  # ttft 100 ms, tpot 100 ms
    assert metrics.meets_slo(fast, {"ttft_ms": 100, "tpot_ms": 100})
    assert not metrics.meets_slo(fast, {"ttft_ms": 99})
    assert not metrics.meets_slo(fast, {"tpot_ms": 99})
    assert not metrics.meets_slo(fast, {"e2e_ms": 299})
    assert metrics.meets_slo(fast, None)
    one = derive(rec([0.1], [1], t_end=0.1))
    assert metrics.meets_slo(one, {"tpot_ms": 1})  # TPOT undefined: not judged
    failed = derive(rec([], [], t_end=0.1, error_kind=metrics.CONNECT))
    assert not metrics.meets_slo(failed, {})


def test_summarize_tenant_mix_failures_and_throughput():
    records = [
        rec([0.1, 0.2, 0.3], [1, 1, 1], t_end=0.3, t_start=100.0),  # good
        rec([0.5, 0.6, 0.7], [1, 1, 1], t_end=0.7, t_start=101.0),  # ttft too slow
        rec([], [], t_end=0.01, t_start=102.0, error_kind=metrics.CONNECT, error="refused"),
        rec([0.1], [1], t_end=5.0, t_start=102.0, error_kind=metrics.TIMEOUT, error="deadline"),
        rec([0.2, 0.3], [2, 2], t_end=0.3, t_start=103.0, tenant="other", error_kind=metrics.TRUNCATED),
    ]
    s = summarize(records, {"chat": {"ttft_ms": 200}}, window=(100.0, 110.0))
    assert s["requests"] == 5 and s["ok"] == 2 and s["failed"] == 3
    assert s["failures"] == {"connect": 1, "http": 0, "stream_error": 0, "truncated": 1, "timeout": 1}
    assert s["output_tokens"] == 6  # failed requests' tokens do not count
    assert s["duration_s"] == pytest.approx(10.0)
    assert s["output_throughput_tok_s"] == pytest.approx(0.6)
    assert s["request_throughput_rps"] == pytest.approx(0.2)
    assert s["goodput"]["good"] == 1 and s["goodput"]["share"] == pytest.approx(0.2)
    assert s["ttft_ms"]["count"] == 2 and s["ttft_ms"]["p50"] == pytest.approx(300.0)
    assert s["itl_ms"]["count"] == 4 and s["itl_ms"]["max"] == pytest.approx(100.0)
    assert s["tpot_ms"]["p50"] == pytest.approx(100.0)
    # Default window: first send .. last end.
    assert metrics.measured_window(records) == pytest.approx((100.0, 107.0))


def test_throughput_timeline_counts_every_token_once():
    records = [rec([0.5, 1.5, 2.5], [1, 2, 1], t_start=10.0), rec([0.2, 0.3], [3, 0], t_start=11.0)]
    xs, ys = metrics.throughput_timeline(records, t0=10.0, bin_s=1.0)
    assert xs == [0.5, 1.5, 2.5] and ys == [1.0, 5.0, 1.0]
    assert sum(ys) == 7


# ------------------------------------------------------------------------------------------------
# SSE parser
# ------------------------------------------------------------------------------------------------

STREAM = (b'data: {"text_output":" Hello","num_output_tokens":1,"finish_reason":"None"}\n\n'
          b": keep-alive comment\n\n"
          b'data: {"text_output":" wor\xc3\xa9ld","num_output_tokens":[2],"finish_reason":["length"],'
          b'"num_input_tokens":7}\r\n\r\n'
          b'event: note\nid: 3\ndata: {"a":\ndata: 1}\n\n')


def _all_events(chunks):
    p, out = SSEParser(), []
    for i, c in enumerate(chunks):
        out += [(e.data, e.event, e.id, e.t) for e in p.feed(c, float(i))]
    return out, p


def test_sse_parser_whole_stream():
    events, p = _all_events([STREAM])
    assert [e[0] for e in events] == ['{"text_output":" Hello","num_output_tokens":1,"finish_reason":"None"}',
                                      '{"text_output":" wor\u00e9ld","num_output_tokens":[2],"finish_reason":["length"],'
                                      '"num_input_tokens":7}',
                                      '{"a":\n1}']
    assert events[2][1:3] == ("note", "3")
    assert not p.partial


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_sse_parser_any_chunking_gives_the_same_events(size):
    whole, _ = _all_events([STREAM])
    parts = [STREAM[i:i + size] for i in range(0, len(STREAM), size)]
    split, p = _all_events(parts)
    assert [e[:3] for e in split] == [e[:3] for e in whole]
    assert not p.partial


def test_sse_parser_every_split_point_and_arrival_times():
    whole, _ = _all_events([STREAM])
    for cut in range(1, len(STREAM)):
        split, _ = _all_events([STREAM[:cut], STREAM[cut:]])
        assert [e[:3] for e in split] == [e[:3] for e in whole], cut
        first_end = STREAM.index(b"\n\n") + 2
        # an event is stamped with the arrival of the chunk that completed it
        assert split[0][3] == (0.0 if cut >= first_end else 1.0)


def test_sse_parser_crlf_split_and_cr_only_lines():
    p = SSEParser()  # "data: a\r\n\r\n" cut inside both CRLFs
    assert p.feed(b"data: a\r") == []
    assert [e.data for e in p.feed(b"\n\r")] == ["a"]
    assert p.feed(b"\n") == []  # the LF of the second CRLF is not another blank line
    assert not p.partial
    assert [e.data for e in SSEParser().feed(b"data: x\rdata: y\r\r")] == ["x\ny"]


def test_sse_parser_truncated_stream_is_partial():
    p = SSEParser()
    assert [e.data for e in p.feed(b'data: {"text_output":"a"}\n\ndata: {"text_')] == ['{"text_output":"a"}']
    assert p.partial
    p = SSEParser()
    p.feed(b'data: {"x":1}\n')  # a data line without the blank line that dispatches it
    assert p.partial


def test_decode_triton_events_and_errors():
    (ev,) = SSEParser().feed(b'data: {"text_output":["ab"],"num_output_tokens":[3],"finish_reason":"stop",'
                             b'"num_input_tokens":5}\n\n', 1.5)
    te = decode_triton_event(ev)
    assert (te.text, te.num_output_tokens, te.finish_reason, te.num_input_tokens, te.error, te.t) == \
        ("ab", 3, "stop", 5, None, 1.5)
    (err,) = SSEParser().feed(b'data: {"error":"engine failed mid-stream"}\n\n')
    assert decode_triton_event(err).error == "engine failed mid-stream"
    (bad,) = SSEParser().feed(b"data: not json\n\n")
    with pytest.raises(ValueError, match="not JSON"):
        decode_triton_event(bad)
    (arr,) = SSEParser().feed(b"data: [1, 2]\n\n")
    with pytest.raises(ValueError, match="object"):
        decode_triton_event(arr)


# ------------------------------------------------------------------------------------------------
# Tenants
# ------------------------------------------------------------------------------------------------


def test_default_tenants_file():
    cfg = load_tenants(REPO / "loadtest" / "tenants.yaml")
    names = [t.name for t in cfg.tenants]
    assert names == ["chat", "summarize"]
    assert {t.protocol for t in cfg.tenants} == {"grpc", "http"}
    assert all(t.model == "smollm2" and t.slo for t in cfg.tenants)


def test_prompts_are_reproducible_from_the_seed():
    cfg = load_tenants(REPO / "loadtest" / "tenants.yaml")
    again = load_tenants(REPO / "loadtest" / "tenants.yaml")
    other = load_tenants(REPO / "loadtest" / "tenants.yaml", seed=99)
    chat, chat2, chat3 = cfg.tenants[0], again.tenants[0], other.tenants[0]
    assert [chat.request(k) for k in range(20)] == [chat2.request(k) for k in range(20)]
    assert chat.request(0) != chat3.request(0)
    assert len({chat.request(k)[0] for k in range(20)}) == 20
    for k in range(50):
        text, max_tokens, words = cfg.tenants[1].request(k)
        assert text.startswith("Summarize the following text.")
        assert 80 <= words - 4 <= 160 and max_tokens == 24


def test_tenant_file_prompts_overrides_and_distributions(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "one"}\n{"text": "two"}\n"three"\n')
    (tmp_path / "p.txt").write_text("alpha\n\nbeta\n")
    doc = {
        "seed": 5,
        "defaults": {"model": "smollm2", "sampling": {"temperature": 0}},
        "tenants": [
            {"name": "a", "fixed_count": 2, "prompt": {"source": "file", "path": "p.jsonl"},
             "max_tokens": {"dist": "uniform", "min": 4, "max": 8}, "think_time_s": [0.5, 1.0]},
            {"name": "b", "weight": 3, "protocol": "http", "prompt": {"source": "file", "path": "p.txt", "prefix": "Q: "},
             "max_tokens": {"dist": "choice", "values": [3, 9]}},
            {"name": "c", "prompt": {"words": {"dist": "normal", "mean": 20, "std": 5, "min": 10, "max": 30}}},
        ],
    }
    cfg = parse_tenants(doc, base_dir=tmp_path, protocol="http")
    a, b, c = cfg.tenants
    assert a.fixed_count == 2 and b.weight == 3 and all(t.protocol == "http" for t in cfg.tenants)
    assert a.think_time_s == (0.5, 1.0)
    assert sorted({a.request(k)[0] for k in range(12)}) == ["one", "three", "two"]
    assert {b.request(k)[0] for k in range(12)} == {"Q: alpha", "Q: beta"}
    assert {a.request(k)[1] for k in range(200)} == set(range(4, 9))
    assert {b.request(k)[1] for k in range(50)} == {3, 9}
    assert all(10 <= c.request(k)[2] <= 30 for k in range(100))
    assert cfg.to_dict()["tenants"][0]["name"] == "a"


@pytest.mark.parametrize("doc,match", [
    ({"tenants": []}, "non-empty"),
    ({"tenants": [{"name": "x"}]}, "no model"),
    ({"tenants": [{"name": "x y", "model": "m"}]}, "identifier"),
    ({"tenants": [{"name": "x", "model": "m"}, {"name": "x", "model": "m"}]}, "duplicate"),
    ({"tenants": [{"name": "x", "model": "m", "colour": 1}]}, "unknown key"),
    ({"tenants": [{"name": "x", "model": "m", "weight": 1, "fixed_count": 1}]}, "not both"),
    ({"tenants": [{"name": "x", "model": "m", "protocol": "ws"}]}, "protocol"),
    ({"tenants": [{"name": "x", "model": "m", "slo": {"ttft": 1}}]}, "slo"),
    ({"tenants": [{"name": "x", "model": "m", "sampling": {"max_tokens": 3}}]}, "tenant level"),
    ({"tenants": [{"name": "x", "model": "m", "max_tokens": {"dist": "zipf"}}]}, "unknown dist"),
    ({"tenants": [{"name": "x", "model": "m", "prompt": {"source": "file"}}]}, "needs a path"),
    ({"tenants": [{"name": "x", "model": "m"}], "extra": 1}, "top-level"),
])
def test_tenant_validation_names_the_problem(doc, match):
    with pytest.raises(ValueError, match=match):
        parse_tenants(doc)


def test_dist_parse_and_sample():
    rng = random.Random(0)
    assert Dist.parse(7, "x").sample(rng) == 7
    d = Dist.parse({"dist": "uniform", "min": 2, "max": 4}, "x")
    assert {d.sample(rng) for _ in range(100)} == {2, 3, 4}
    with pytest.raises(ValueError):
        Dist.parse({"dist": "uniform", "min": 5, "max": 4}, "x")


# ------------------------------------------------------------------------------------------------
# Raw file and report
# ------------------------------------------------------------------------------------------------


def _fake_run(out: Path, shape="steps") -> list[RequestRecord]:
    rng = random.Random(1)
    records = []
    started = 1_000.0
    for i in range(60):
        users = 1 if i < 20 else 2 if i < 40 else 4
        tenant = "chat" if i % 3 else "summarize"
        ttft = 0.05 * users + rng.random() * 0.02
        gaps = [0.02 * users + rng.random() * 0.005 for _ in range(7)]
        times = [ttft]
        for g in gaps:
            times.append(times[-1] + g)
        t_start = started + (i // 20) * 10 + (i % 20) * 0.5
        r = rec(times, [1] * 8, t_end=times[-1], tenant=tenant, t_start=t_start, users=users,
                warmup=i < 2, sched_lag=0.001 * i if shape == "poisson" else None)
        records.append(r)
    records.append(rec([], [], t_end=0.01, tenant="chat", t_start=started + 25, users=2, error_kind="http",
                       error="HTTP 400: bad"))
    out.mkdir(parents=True, exist_ok=True)
    w = JsonlWriter(out / "requests.jsonl")
    w.write_many(r.to_dict() for r in records)
    w.close()
    plan = {"shape": shape, "users": 4, "run_time_s": 30.0, "rate": 2.0,
            "stages": [{"start_s": 10.0 * i, "end_s": 10.0 * (i + 1), "users": u} for i, u in enumerate((1, 2, 4))]}
    write_run_meta(out, {"started": started, "ended": started + 31, "warmup_s": 1.0, "plan": plan, "workers": 1,
                         "host": "http://x:8000", "grpc_url": "x:8001", "seed": 1,
                         "tenants": {"seed": 1, "path": "t.yaml", "tenants": [
                             {"name": "chat", "slo": {"ttft_ms": 150}}, {"name": "summarize", "slo": {}}]}})
    return records


def test_jsonl_roundtrip(tmp_path):
    records = _fake_run(tmp_path)
    back = read_records(tmp_path / "requests.jsonl")
    assert back == records


def test_report_from_raw_files(tmp_path):
    records = _fake_run(tmp_path)
    summary = write_report(tmp_path)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["overall"] == json.loads(json.dumps(summary["overall"]))
    measured = [r for r in records if not r.warmup]
    assert summary["run"]["warmup_excluded"] == 2 and summary["overall"]["requests"] == len(measured)
    assert list(summary["tenants"]) == ["chat", "summarize"]
    chat = [r for r in measured if r.tenant == "chat"]
    exact = summarize(chat, {"chat": {"ttft_ms": 150}}, metrics.measured_window(measured))
    assert summary["tenants"]["chat"]["ttft_ms"] == exact["ttft_ms"]
    assert summary["tenants"]["chat"]["failures"]["http"] == 1
    assert summary["tenants"]["chat"]["goodput"]["share"] < 1.0
    for g in ("overall", "chat", "summarize"):
        s = summary["overall"] if g == "overall" else summary["tenants"][g]
        for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            assert all(s[key][f"p{p}"] is not None for p in (50, 90, 95, 99)), (g, key)
    # ITL grows with concurrency in the fake data, and the report sees it per step.
    levels = [c["users"] for c in summary["by_concurrency"]]
    assert levels == [1, 2, 4]
    p50s = [c["overall"]["itl_ms"]["p50"] for c in summary["by_concurrency"]]
    assert p50s == sorted(p50s)
    md = (tmp_path / "report.md").read_text()
    assert "| chat |" in md and "## By concurrency" in md
    for fname in PLOTS.values():
        assert (tmp_path / fname).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", fname
        assert f"({fname})" in md


def test_each_step_of_users_gets_the_server_steps_read_in_its_time(tmp_path):
    """server_steps.json's readings of /metrics through the run (as loadtest.run writes them: bucket bounds as JSON
    strings) give each stage of users the engine's steps between its first and last reading: their mean wall time
    and the share of the stage spent in them; the report's table shows both."""
    _fake_run(tmp_path)
    started, readings, count, seconds = 1_000.0, [], 0, 0.0
    for k in range(31):  # a reading a second; a step of 10 / 20 / 40 ms, 25 / 20 / 10 of them a second by stage
        step_ms, per_s = ((10.0, 25), (20.0, 20), (40.0, 10))[min(k // 10, 2)]
        if k:
            count, seconds = count + per_s, seconds + per_s * step_ms / 1e3
        steps = {"le": {"1.0": count, "Infinity": count}, "count": count, "sum": 3.0 * count, "seconds": seconds}
        readings.append([started + k + 0.5, {"steps": steps, "preemptions": 0, "prompt_tokens": count,
                                             "prefix_cache_hit_tokens": 0}])
    (tmp_path / "server_steps.json").write_text(json.dumps({"steps": count, "readings": readings}))
    one, two, four = write_report(tmp_path)["by_concurrency"]
    assert [s["server_steps"]["steps"] for s in (one, two, four)] == [9 * 25, 9 * 20, 9 * 10]
    assert [s["server_steps"]["mean_ms"] for s in (one, two, four)] == pytest.approx([10.0, 20.0, 40.0])
    assert [s["server_steps"]["busy_share"] for s in (one, two, four)] == pytest.approx([0.25, 0.4, 0.4])
    md = (tmp_path / "report.md").read_text()
    assert "engine step ms | engine busy |" in md and "| 10.00 | 25.0 % |" in md


def test_a_request_sent_late_in_a_step_leaves_its_later_gaps_to_the_next(tmp_path):
    """A request sent at the end of the 1-user step that streams on into the 2-user step (slowly, as it would
    beside more users): it counts among the first step's requests, but its slow gaps go to the second step's ITL
    (2026-12-06: one such request made a 1-user step's p99 14.5 ms against 6.3 ms without it)."""
    records = _fake_run(tmp_path)
    started = 1_000.0
    straddler = rec([0.05] + [0.05 + 0.5 * k for k in range(1, 9)], [1] * 9, tenant="chat", t_start=started + 9.9,
                    users=1)
    (tmp_path / "requests.jsonl").unlink()
    w = JsonlWriter(tmp_path / "requests.jsonl")
    w.write_many(r.to_dict() for r in records + [straddler])
    w.close()
    one, two = write_report(tmp_path)["by_concurrency"][:2]
    assert one["overall"]["requests"] == 19 and two["overall"]["requests"] == 21  # by send (two warm-up, one error)
    assert one["overall"]["itl_ms"]["max"] < 30 and one["tenants"]["chat"]["itl_ms"]["max"] < 30
    assert two["overall"]["itl_ms"]["max"] == pytest.approx(500.0)
    assert two["overall"]["itl_ms"]["count"] == 7 * 20 + 8  # its 20 ok requests and the 8 gaps that came late


def _step(users: int, share: float, rps: float) -> dict:
    at = lambda v: {"p50": v, "p90": 2 * v}  # noqa: E731
    return {"users": users, "overall": {"requests": 10, "failed": 0, "ttft_ms": at(100.0), "itl_ms": at(20.0 * users),
                                        "goodput": {"share": share, "rate_rps": rps}, "output_throughput_tok_s": 50.0}}


def test_compare_counts_the_sessions_held_at_the_slo(tmp_path):
    """loadtest.compare: a config holds a step when 90% of its requests meet their SLO; sessions held is the most
    users of a held step (not the last one before a failing step), goodput the best step's."""
    runs = {"long_fp16": [_step(2, 1.0, 0.2), _step(4, 0.95, 0.3), _step(8, 0.5, 0.25), _step(16, 0.1, 0.1)],
            "long_alrkvd": [_step(2, 1.0, 0.2), _step(4, 0.85, 0.35), _step(8, 0.9, 0.6), _step(16, 0.4, 0.5)]}
    folders = []
    for name, steps in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({"by_concurrency": steps}))
        folders.append(str(tmp_path / name))
    assert compare.main(folders + ["--out", str(tmp_path / "cmp")]) == 0
    result = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert result["configs"] == {"long_fp16": {"sessions_held": 4, "best_goodput_rps": 0.3},
                                 "long_alrkvd": {"sessions_held": 8, "best_goodput_rps": 0.6}}
    assert result["ratios"] == {"of": "long_alrkvd", "to": "long_fp16", "sessions_held": 2.0, "best_goodput": 2.0}
    assert "sessions held 2.00x, best goodput 2.00x" in (tmp_path / "cmp" / "compare.md").read_text()
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):  # a run that left no summary
        compare.main([str(tmp_path), "--out", str(tmp_path / "cmp")])


def test_compare_holds_each_tenant_on_its_own_requests(tmp_path):
    """Per tenant, a step is held on that tenant's requests alone: many chats within their SLO hold the step overall
    while its few documents all miss theirs (the long-context run of 2026-12-06: 92 chats and 6 documents at 32
    users). A step where a tenant sent nothing says nothing of it."""
    def step(users, chat, document):
        s = _step(users, 0.9, chat[1] + document[1])
        s["tenants"] = {"chat": _step(users, *chat)["overall"], "document": _step(users, *document)["overall"]}
        if document[0] is None:
            s["tenants"]["document"]["requests"] = 0
        return s
    runs = {"fp16": [step(4, (1.0, 0.3), (1.0, 0.1)), step(8, (1.0, 0.5), (0.5, 0.05)),
                     step(16, (1.0, 0.9), (0.0, 0))],
            "alrkvd": [step(4, (1.0, 0.3), (1.0, 0.1)), step(8, (0.8, 0.4), (0.95, 0.2)),
                       step(16, (0.5, 0.4), (None, 0))]}
    summaries = {name: {"by_concurrency": steps} for name, steps in runs.items()}
    result = compare.compare(summaries)
    assert result["configs"]["fp16"]["sessions_held"] == 16
    assert result["configs"]["fp16"]["tenants"] == {"chat": {"sessions_held": 16, "best_goodput_rps": 0.9},
                                                    "document": {"sessions_held": 4, "best_goodput_rps": 0.1}}
    assert result["configs"]["alrkvd"]["tenants"]["document"] == {"sessions_held": 8, "best_goodput_rps": 0.2}
    assert result["ratios"]["tenants"]["document"] == {"sessions_held": 2.0, "best_goodput": 2.0}
    assert "- document: sessions held 2.00x, best goodput 2.00x" in compare.render_markdown(result)


def test_summary_splits_a_session_tenants_first_token_by_turn():
    """A tenant with turns: time to first token of sessions' first turns apart from their later ones (which may find
    their history cached), by prompt number; a tenant without turns gets no split."""
    records = [rec([0.5 + k % 4, 5.0], [1, 1], t_end=5.0, tenant="docs", prompt_seq=k) for k in range(8)]
    records += [rec([0.2, 0.3], [1, 1], t_end=0.3, tenant="chat", prompt_seq=k) for k in range(3)]
    meta = {"tenants": {"tenants": [{"name": "docs", "prompt": {"turns": 4}},
                                    {"name": "chat", "prompt": {"turns": 1}}]}}
    s = build_summary(records, meta)
    by_turn = s["tenants"]["docs"]["ttft_ms_by_turn"]
    assert (by_turn["first"]["count"], by_turn["first"]["p50"]) == (2, 500.0)
    assert (by_turn["later"]["count"], by_turn["later"]["min"], by_turn["later"]["max"]) == (6, 1500.0, 3500.0)
    assert "ttft_ms_by_turn" not in s["tenants"]["chat"]


def test_report_poisson_arrivals_and_empty_run(tmp_path):
    _fake_run(tmp_path / "p", shape="poisson")
    s = build_summary(read_records(tmp_path / "p" / "requests.jsonl"), json.loads((tmp_path / "p" / "run.json").read_text()))
    assert s["arrivals"]["target_rate_rps"] == 2.0
    assert s["arrivals"]["schedule_lag_ms"]["max"] == pytest.approx(59.0)
    (tmp_path / "empty").mkdir()
    summary = write_report(tmp_path / "empty")  # no requests at all: still a report, no crash
    assert summary["overall"]["requests"] == 0


# ------------------------------------------------------------------------------------------------
# Command line, shapes and Locust options (Locust only in a child interpreter)
# ------------------------------------------------------------------------------------------------


def test_run_command_line():
    from loadtest.run import build_parser, locust_command

    a = build_parser().parse_args(["--host", "http://h:8000", "--shape", "poisson", "--rate", "2", "-u", "8",
                                   "--out", "reports/x", "--", "--loglevel", "DEBUG"])
    cmd = locust_command(a, Path("reports/x"))
    assert cmd[1:5] == ["-m", "locust", "-f", str(REPO / "loadtest" / "locustfile.py")]
    joined = " ".join(cmd)
    for part in ("--headless", "--host http://h:8000", "--users 8", "--shape poisson", "--rate 2.0",
                 "--out-dir reports/x", "--html reports/x/locust.html", "--loglevel DEBUG"):
        assert part in joined, part
    steps = locust_command(build_parser().parse_args(["--shape", "steps", "--steps", "1,3,2"]), Path("o"))
    assert steps[steps.index("--users") + 1] == "3"


SHAPES_CHECK = textwrap.dedent("""
    import json
    from locust.argument_parser import parse_options
    from loadtest import locustfile, shapes

    def ticks(shape, times):
        out = []
        for t in times:
            shape.get_run_time = lambda t=t: t
            out.append(shape.tick())
        return out

    o = parse_options(["-f", locustfile.__file__, "--shape", "steps", "--steps", "1,2,4", "--step-time", "10s"])
    steps = ticks(shapes.shape_from_options(o), [0, 9.9, 10, 25, 30])
    o = parse_options(["-f", locustfile.__file__, "-u", "3", "-t", "1m", "--shape", "fixed"])
    fixed = shapes.shape_from_options(o)
    o = parse_options(["-f", locustfile.__file__, "-u", "5", "-t", "20", "--shape", "poisson", "--rate", "0.5"])
    poisson = shapes.shape_from_options(o)
    classes = locustfile.user_classes(locustfile.load_config(o))
    # docker-compose.yml's Locust commands parse with this locustfile's options
    import yaml
    services = yaml.safe_load(open("docker-compose.yml"))["services"]
    compose = {name: vars(parse_options(services[name]["command"][1:]))
               for name in ("locust-master", "locust-worker")}
    print(json.dumps({
        "steps": steps, "fixed": ticks(fixed, [0, 59, 60]), "poisson": ticks(poisson, [0, 20]),
        "poisson_plan": poisson.plan(), "duration": shapes.parse_duration("1m30s"),
        "classes": [(c.__name__, c.protocol, c.weight, c.arrival_share) for c in classes],
        "grpc": locustfile.default_grpc_url("http://example:8000"),
        "compose": {n: {k: o[k] for k in ("master", "worker", "grpc_url", "out_dir", "tenants")}
                    for n, o in compose.items()},
    }))
""")


def test_shapes_and_locust_options_in_a_child_process():
    out = subprocess.run([sys.executable, "-c", SHAPES_CHECK], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["steps"] == [[1, 4.0], [1, 4.0], [2, 4.0], [4, 4.0], None]
    assert r["fixed"] == [[3, 3.0], [3, 3.0], None]
    assert r["poisson"] == [[5, 5.0], None] and r["poisson_plan"]["rate"] == 0.5
    assert r["duration"] == 90.0
    assert r["classes"] == [["chat", "grpc", 1, 0.5], ["summarize", "http", 1, 0.5]]
    assert r["grpc"] == "example:8001"
    master, worker = r["compose"]["locust-master"], r["compose"]["locust-worker"]
    assert master["master"] and master["grpc_url"] and master["out_dir"].startswith("reports")
    assert worker["worker"] and worker["tenants"].endswith("tenants.yaml")


def test_shared_prompt_key_and_kv_benchmark_repository(tmp_path):
    from loadtest.kv_benchmark import build_repository, set_parameters, variant_config

    cfg = load_tenants(REPO / "loadtest" / "tenants_kv.yaml")
    fp16, alrkvd = cfg.tenants
    assert (fp16.model, alrkvd.model) == ("smollm2_fp16", "smollm2_alrkvd-cpu")  # the served preset
    assert [fp16.request(k) for k in range(10)] == [alrkvd.request(k) for k in range(10)]
    base = (REPO / "model_repository" / "smollm2" / "config.pbtxt").read_text()
    text = variant_config(base, "smollm2_alrkvd", "alrkvd")
    assert 'name: "smollm2_alrkvd"' in text and 'string_value: "alrkvd"' in text
    same = [a == b for a, b in zip(base.splitlines(), text.splitlines())]
    assert len(text.splitlines()) == len(base.splitlines())
    for line, unchanged in zip(text.splitlines(), same):  # only the name and kv_format lines differ
        assert unchanged or line.startswith("name:") or '"kv_format"' in line, line
    repo = build_repository(["smollm2_fp16", "smollm2_alrkvd-cpu"], tmp_path,
                            params={"enable_prefix_caching": "true", "kv_budget_bytes": "33554432"})
    for m in ("smollm2_fp16", "smollm2_alrkvd-cpu"):
        assert (repo / m / "1" / "model.py").is_file()
        text = (repo / m / "config.pbtxt").read_text()
        assert f'name: "{m}"' in text
        # --set: a parameter the base has is replaced, one it lacks is added
        assert text.count('"kv_budget_bytes"') == 1 and 'string_value: "33554432"' in text
        assert '{ key: "enable_prefix_caching", value: { string_value: "true" } }' in text
    with pytest.raises(SystemExit):
        build_repository(["nomodel_fp16"], tmp_path / "x")
    # a JSON value (kv_options) is written as a text-format string, and replaced whole when set again
    text = set_parameters(base, {"kv_options": '{"block_size": 128}'})
    value = '{"block_size": 64, "note": "a\\b"}'  # a quote and a backslash to escape
    text = set_parameters(text, {"kv_options": value})
    assert text.count('"kv_options"') == 1
    assert r'{ key: "kv_options", value: { string_value: "{\"block_size\": 64, \"note\": \"a\\b\"}" } }' in text
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2
    parsed = text_format.Parse(text, model_config_pb2.ModelConfig()).parameters["kv_options"].string_value
    assert parsed == value  # what Triton hands the model


SESSIONS_CHECK = textwrap.dedent("""
    import json
    from types import SimpleNamespace
    from loadtest.tenants import parse_tenants
    from loadtest.users import LLMUser, RunState

    chat, plain = parse_tenants({"defaults": {"model": "m"}, "tenants": [
        {"name": "chat", "prompt": {"source": "conversation", "turns": 3}}, {"name": "plain"}]}).tenants
    state = RunState(grpc_url="x")
    a, b = (SimpleNamespace(tenant=chat, state=state, session=0, turn=None) for _ in range(2))
    sent = {"a": [], "b": []}
    for who in "aabaabbbab":
        sent[who].append(LLMUser.next_seq(a if who == "a" else b))
    plain_user = SimpleNamespace(tenant=plain, state=state)
    print(json.dumps({"sent": sent, "plain": [LLMUser.next_seq(plain_user) for _ in range(3)]}))
""")


def test_a_user_continues_its_own_conversation():
    """A conversation tenant's turns go to one user in order (prompt k is turn k % turns of session k // turns), so
    a turn is sent after its history's answer, as a person continues a chat (before, consecutive prompts went to
    whichever user asked next: a session's turns were in flight at once); sessions are numbered across users.
    (In a subprocess: Locust's import patches the process.)"""
    out = subprocess.run([sys.executable, "-c", SESSIONS_CHECK], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["sent"] == {"a": [0, 1, 2, 6, 7], "b": [3, 4, 5, 9, 10]}  # b's second session is the third
    assert result["plain"] == [0, 1, 2]


def test_long_context_tenants_give_the_requested_lengths():
    """loadtest/tenants_long.yaml (issue 36): documents of the requested words of real text and a question;
    conversations whose prompts grow by one exchange a turn within a session; deterministic."""
    from loadtest.tenants import CORPUS, QUESTIONS, corpus_paragraphs

    doc, chat = load_tenants(REPO / "loadtest" / "tenants_long.yaml").tenants
    assert (doc.prompt.source, doc.prompt.turns) == ("document", 4)
    assert (chat.prompt.source, chat.prompt.turns) == ("conversation", 8)
    corpus = {w for p in corpus_paragraphs(str(CORPUS)) for w in p}
    for k in range(6):
        text, _, words = doc.request(k)
        body, question = text.split("\n\nQuestion: ")
        assert 12000 <= len(body.split()) <= 24000 and question.removesuffix("\nAnswer briefly:") in QUESTIONS
        assert set(body.split()) <= corpus and words == len(text.split())
        assert doc.request(k) == (text, doc.request(k)[1], words)  # a pure function of k
    prompts = [chat.request(k)[0] for k in range(10)]
    for k, p in enumerate(prompts):
        turn = k % 8
        assert p.count("User: ") == turn + 1 and p.count("Assistant: ") == turn and p.endswith("\nAssistant:")
        assert all(200 <= len(line.split()) - 1 <= 600 for line in p.splitlines()[:-1])  # each message's words
        if turn:  # the same session: the history of the previous turn, one reply and one user message more
            history = prompts[k - 1].removesuffix("\nAssistant:")
            assert p.startswith(history + "\nAssistant: ")
    assert prompts[8].count("User: ") == 1 and prompts[8] != prompts[0]  # the next session starts anew


def test_long_context_tenants_with_pauses_send_the_same_prompts():
    """tenants_long_think.yaml: tenants_long.yaml's prompt streams, with users pausing 5-15 s between turns."""
    plain, think = (load_tenants(REPO / "loadtest" / f).tenants for f in ("tenants_long.yaml", "tenants_long_think.yaml"))
    for a, b in zip(plain, think, strict=True):
        assert (a.think_time_s, b.think_time_s) == ((0.0, 0.0), (5.0, 15.0))
        assert [a.request(k) for k in range(3)] == [b.request(k) for k in range(3)]


def test_a_document_session_asks_its_questions_about_one_document():
    """A document tenant with `turns` n: prompts k of one session (k // n) share the document and ask different
    questions; the next session has another document; with one turn a prompt is what it always was."""
    spec = {"name": "d", "prompt": {"source": "document", "words": 300, "turns": 3}}
    doc, = parse_tenants({"seed": 36, "defaults": {"model": "m"}, "tenants": [spec]}).tenants
    split = [doc.request(k)[0].split("\n\nQuestion: ") for k in range(6)]
    assert split[0][0] == split[1][0] == split[2][0] != split[3][0] == split[4][0] == split[5][0]
    assert len({q for _, q in split[:3]}) == 3 and len(split[0][0].split()) == 300
    one, = parse_tenants({"seed": 36, "defaults": {"model": "m"}, "tenants": [dict(spec, prompt=dict(
        spec["prompt"], turns=1))]}).tenants
    assert one.request(0)[0].startswith(corpus_words(one.prompt.path, 300, random.Random("36/d/0")) + "\n\nQuestion: ")


def test_long_context_sources_are_validated(tmp_path):
    with pytest.raises(ValueError, match="cannot be read"):
        parse_tenants({"defaults": {"model": "m"}, "tenants": [
            {"name": "d", "prompt": {"source": "document", "path": str(tmp_path / "missing.txt")}}]})
    with pytest.raises(ValueError, match="turns"):
        parse_tenants({"defaults": {"model": "m"}, "tenants": [
            {"name": "c", "prompt": {"source": "conversation", "turns": 0}}]})
