"""Soak test: a long steady load with cancellations and bad requests, watching the server for growth.

    python -m loadtest.soak                                   # = make soak: 60 minutes, reports/soak
    python -m loadtest.soak --duration 10m --out reports/soak10
    python -m loadtest.soak --host http://127.0.0.1:8000 --grpc-url 127.0.0.1:8001 \
        --metrics-url http://127.0.0.1:8002/metrics --duration 45s      # a server already running

Without --host a fresh tritonserver is started through the project's launcher (server.serve) on free
loopback ports with the tenants' models, and stopped at the end. The load is the ordinary Locust run
of loadtest/run.py (loadtest/tenants_soak.yaml: gRPC and HTTP tenants, some streams dropped mid-way by
the client, bad requests of every kind in tenants.INVALID_KINDS). Meanwhile a sampler records every
--interval the resident memory, open file descriptors and threads of tritonserver and of its
Python-backend stubs (psutil, which Locust itself requires), the server's KV blocks in use and request
counters (/metrics), and the client's requests by outcome (requests.jsonl).

After the load: a settle (until the server reports nothing running and no KV block in use and its fds
and threads are back to the baseline, at most --settle), then the rules of `verdict()`:

    kv_blocks_free      no KV block in use, nothing running or waiting
    fds, threads        no more open fds / threads than before the load (idle against idle)
    outcomes            every request ended as it was built to: ordinary ones served, drops cancelled,
                        bad ones refused before any output
    bad_requests        the server counted each bad request as refused (alrkvd:request_failure_total{invalid})
    served              at least one ordinary request served
    same_processes      the server and its stubs are the processes that were there at the start
    memory              the slope of anonymous resident memory (server + stubs, RSS less file-backed and shared
                        pages, linear fit over the second half of the load) at most --max-mem-slope MB/h; judged
                        when that half lasts --min-mem-window or longer. Anonymous memory is where a leak grows;
                        file-backed pages (the memory-mapped weights) come and go with the machine's memory
                        pressure (a 60-minute soak saw 250 MB of them reclaimed when another job took 13 GB)
    clean_stop          (a server the soak started) it stops at once, exit 0: no request left in the model

Writes soak.json (settings, every sample, the summary), soak.png, and the load test's own files and
report (requests.jsonl, summary.json, report.md ...) in --out. Exit status: 0 when every rule holds,
1 when one does not, 2 on a bad setup.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import psutil

from loadtest import run as _run
from loadtest.metrics import EXPECT_INVALID, RequestRecord, expected, outcome_of
from loadtest.tenants import load_tenants

SOAK_TENANTS = Path(__file__).with_name("tenants_soak.yaml")
SOAK_FILE = "soak.json"
PLOT_FILE = "soak.png"
MB = 1 << 20

# The memory rule. A leak worth catching in a long-running server: 50 MB/h is 1.2 GB a day, the whole
# memory of a small serving box in a couple of weeks; the CPU default's server + stub resident set is
# ~1.5 GB. Allocator noise (glibc arenas, torch's CPU allocator meeting a new batch shape) comes in steps
# of a few MB that stop once every shape has been seen: the second half of the load is past them, and
# a window shorter than ~5 minutes turns one such step into a slope above the threshold, so shorter
# windows are reported, not judged.
MAX_MEM_SLOPE_MB_H = 50.0
MIN_MEM_WINDOW_S = 300.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.soak", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", default="60m", help="how long the load runs, e.g. 60m, 10m, 45s")
    p.add_argument("--interval", default="10s", help="time between samples")
    p.add_argument("--warmup", default="", help="left out of the steady memory fit (default: a tenth of the "
                                                "duration, between 20 s and 5 min)")
    p.add_argument("--settle", default="60s", help="after the load, the longest wait for an idle server")
    p.add_argument("--tenants", default=str(SOAK_TENANTS), help="tenants YAML (default: loadtest/tenants_soak.yaml)")
    p.add_argument("--users", type=int, default=0, help="Locust users (default: the tenants' fixed counts)")
    p.add_argument("--model", default="", help="force every tenant onto one model")
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--host", default="", help="Triton HTTP URL of a running server (default: start a fresh one)")
    p.add_argument("--grpc-url", default="", help="its gRPC host:port (default: the host name, port 8001)")
    p.add_argument("--metrics-url", default="", help="its /metrics URL (default: the host name, port 8002)")
    p.add_argument("--server-pid", type=int, default=0,
                   help="tritonserver's pid (default: the process listening on the --host port)")
    p.add_argument("--max-mem-slope", type=float, default=MAX_MEM_SLOPE_MB_H,
                   help="memory rule: the most MB/h the RSS may grow over the second half of the load")
    p.add_argument("--min-mem-window", default=f"{MIN_MEM_WINDOW_S:g}s",
                   help="memory rule: judged only when the second half lasts this long")
    p.add_argument("--wait-ready", type=float, default=900.0, help="seconds to wait for a fresh server")
    p.add_argument("--out", default="reports/soak", help="report folder")
    return p


# ------------------------------------------------------------------------------------------------
# Observing the server: processes and /metrics
# ------------------------------------------------------------------------------------------------


def listening_pid(port: int) -> int | None:
    """The pid of the process listening on TCP `port` on this machine."""
    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return c.pid
    return None


def sample_processes(server_pid: int) -> list[dict]:
    """RSS and anonymous RSS (MB), open fds and threads of tritonserver and every process under it (its stubs)."""
    server = psutil.Process(server_pid)
    out = []
    for proc in [server] + server.children(recursive=True):
        try:
            with proc.oneshot():
                mem = proc.memory_info()  # Linux: `shared` is the resident file-backed and shmem pages
                out.append({"pid": proc.pid, "name": proc.name(), "rss_mb": mem.rss / MB,
                            "anon_mb": (mem.rss - mem.shared) / MB, "fds": proc.num_fds(),
                            "threads": proc.num_threads()})
        except psutil.NoSuchProcess:
            continue
    return out


_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")


def parse_prometheus(text: str) -> list[tuple[str, dict, float]]:
    """(name, labels, value) of every sample in a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            out.append((m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")), float(m.group(3))))
    return out


def server_metrics(metrics_url: str, models: list[str]) -> dict:
    """The engine's gauges and request counters for `models` (summed over them), from /metrics; with its steps'
    tokens (`alrkvd:iteration_tokens_total`: cumulative counts by upper bound `le`, `count`, `sum`) and their
    seconds (`alrkvd:iteration_duration_seconds_sum`)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        samples = parse_prometheus(r.read().decode("utf-8", "replace"))
    out = {"kv_blocks_used": 0.0, "kv_blocks_total": 0.0, "running": 0.0, "waiting": 0.0, "preemptions": 0.0,
           "prompt_tokens": 0.0, "prefix_cache_hit_tokens": 0.0, "success": Counter(), "failure": Counter(),
           "steps": {"le": Counter(), "count": 0.0, "sum": 0.0, "seconds": 0.0}}
    gauges = {"alrkvd:kv_cache_blocks_used": "kv_blocks_used", "alrkvd:kv_cache_blocks_total": "kv_blocks_total",
              "alrkvd:num_requests_running": "running", "alrkvd:num_requests_waiting": "waiting",
              "alrkvd:num_preemptions_total": "preemptions", "alrkvd:prompt_tokens_total": "prompt_tokens",
              "alrkvd:prefix_cache_hit_tokens_total": "prefix_cache_hit_tokens"}
    for name, labels, value in samples:
        if labels.get("model") not in models:
            continue
        if name in gauges:
            out[gauges[name]] += value
        elif name == "alrkvd:request_success_total":
            out["success"][labels.get("finished_reason", "?")] += value
        elif name == "alrkvd:request_failure_total":
            out["failure"][labels.get("reason", "?")] += value
        elif name == "alrkvd:iteration_tokens_total_bucket":
            out["steps"]["le"][float(labels["le"])] += value
        elif name in ("alrkvd:iteration_tokens_total_count", "alrkvd:iteration_tokens_total_sum"):
            out["steps"][name.rsplit("_", 1)[1]] += value
        elif name == "alrkvd:iteration_duration_seconds_sum":
            out["steps"]["seconds"] += value
    out["success"], out["failure"] = dict(out["success"]), dict(out["failure"])
    out["steps"]["le"] = dict(out["steps"]["le"])
    return out


class RecordTail:
    """Reads requests.jsonl as Locust appends to it: the client's requests by outcome so far."""

    def __init__(self, path: Path):
        self.path = path
        self._offset = 0
        self._partial = b""
        self.by_outcome: Counter = Counter()
        self.unexpected: Counter = Counter()
        self.by_tenant: dict[str, Counter] = {}
        self.invalid_sent = 0
        self.invalid_by_kind: Counter = Counter()

    def poll(self) -> None:
        if not self.path.is_file():
            return
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            if line.strip():
                self.add(RequestRecord.from_dict(json.loads(line)))

    def add(self, rec: RequestRecord) -> None:
        o = outcome_of(rec)
        self.by_outcome[o] += 1
        self.by_tenant.setdefault(rec.tenant, Counter())[o] += 1
        if not expected(rec):
            self.unexpected[f"{rec.expect or 'ordinary'}:{o}"] += 1
        if rec.expect == EXPECT_INVALID:
            self.invalid_sent += 1
            self.invalid_by_kind[f"{rec.protocol}:{rec.invalid_kind}:{o}"] += 1

    @property
    def total(self) -> int:
        return sum(self.by_outcome.values())


@dataclass
class Sampler:
    """Takes one sample now (`take`) or every `interval_s` on a thread (`start` / `stop`)."""

    server_pid: int
    metrics_url: str
    models: list[str]
    tail: RecordTail
    interval_s: float = 10.0
    t0: float = field(default_factory=time.monotonic)  # the time axis: seconds from the start of the load
    samples: list[dict] = field(default_factory=list)
    on_sample: object = None  # called with each sample
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def take(self, phase: str) -> dict:
        t = time.monotonic() - self.t0
        procs = sample_processes(self.server_pid)
        try:
            server = server_metrics(self.metrics_url, self.models)
        except (urllib.error.URLError, OSError, ValueError) as e:
            server = {"error": str(e)}
        self.tail.poll()
        stubs = [p for p in procs if p["pid"] != self.server_pid]
        s = {
            "t": round(t, 3), "wall": time.time(), "phase": phase, "processes": procs,
            "rss_mb": {"server": sum(p["rss_mb"] for p in procs if p["pid"] == self.server_pid),
                       "stubs": sum(p["rss_mb"] for p in stubs), "total": sum(p["rss_mb"] for p in procs)},
            "anon_mb": {"server": sum(p["anon_mb"] for p in procs if p["pid"] == self.server_pid),
                        "stubs": sum(p["anon_mb"] for p in stubs), "total": sum(p["anon_mb"] for p in procs)},
            "fds": sum(p["fds"] for p in procs), "threads": sum(p["threads"] for p in procs),
            "server": server,
            "client": {"requests": self.tail.total, "by_outcome": dict(self.tail.by_outcome),
                       "unexpected": sum(self.tail.unexpected.values())},
        }
        self.samples.append(s)
        if self.on_sample is not None:
            self.on_sample(s)
        return s

    def start(self) -> None:
        def loop():
            while not self._stop.wait(self.interval_s):
                self.take("load")

        self._thread = threading.Thread(target=loop, name="soak-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


# ------------------------------------------------------------------------------------------------
# The rules
# ------------------------------------------------------------------------------------------------


def linear_fit(ts: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least-squares (slope, intercept) of ys over ts; None with fewer than 3 points or no spread."""
    n = len(ts)
    if n < 3:
        return None
    mt, my = sum(ts) / n, sum(ys) / n
    var = sum((t - mt) ** 2 for t in ts)
    if var == 0:
        return None
    slope = sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var
    return slope, my - slope * mt


def memory_slope(samples: list[dict], t_from: float, t_to: float, key: str = "total", memory: str = "anon_mb") -> dict:
    """Linear fit of `memory` (anon_mb or rss_mb) [key] over the load samples in [t_from, t_to]: MB per hour."""
    pts = [(s["t"], s[memory][key]) for s in samples if s["phase"] == "load" and t_from <= s["t"] <= t_to]
    fit = linear_fit([t for t, _ in pts], [y for _, y in pts])
    window = (pts[-1][0] - pts[0][0]) if pts else 0.0
    return {"from_s": t_from, "to_s": t_to, "points": len(pts), "window_s": window,
            "mb_per_h": fit[0] * 3600.0 if fit else None,
            "growth_mb": fit[0] * window if fit else None}


def verdict(before: dict, after: dict, samples: list[dict], tail: RecordTail, duration_s: float,
            warmup_s: float, max_mem_slope: float, min_mem_window_s: float) -> dict:
    """Every rule of the soak (the module docstring lists them), from the idle samples before and after
    the load, the samples under load and the client's requests."""
    checks = {}
    srv = after["server"]
    if "error" in srv:
        checks["kv_blocks_free"] = {"pass": False, "detail": f"/metrics unreadable at the end: {srv['error']}"}
    else:
        ok = srv["kv_blocks_used"] == 0 and srv["running"] == 0 and srv["waiting"] == 0
        checks["kv_blocks_free"] = {"pass": ok, "detail": f"{srv['kv_blocks_used']:g} of {srv['kv_blocks_total']:g} "
                                    f"KV blocks in use, {srv['running']:g} running, {srv['waiting']:g} waiting"}
    for key in ("fds", "threads"):
        checks[key] = {"pass": after[key] <= before[key],
                       "detail": f"{before[key]} before the load, {after[key]} after it "
                                 f"(at most {max(s[key] for s in samples)} under load)"}
    n_bad = sum(tail.unexpected.values())
    checks["outcomes"] = {"pass": n_bad == 0, "detail": f"{n_bad} of {tail.total} requests ended otherwise than "
                          "built to" + (f": {dict(tail.unexpected)}" if n_bad else "")}
    if "error" in srv or "error" in before["server"]:
        checks["bad_requests"] = {"pass": False, "detail": "/metrics unreadable"}
    else:
        refused = srv["failure"].get("invalid", 0) - before["server"]["failure"].get("invalid", 0)
        checks["bad_requests"] = {"pass": refused == tail.invalid_sent,
                                  "detail": f"{tail.invalid_sent} sent, {refused:g} counted invalid by the server"}
    served = tail.by_outcome.get("ok", 0)
    checks["served"] = {"pass": served > 0, "detail": f"{served} requests served to the end"}
    pids = lambda s: sorted((p["pid"], p["name"]) for p in s["processes"])  # noqa: E731
    checks["same_processes"] = {"pass": pids(before) == pids(after),
                                "detail": f"{pids(before)} before, {pids(after)} after"}
    half = memory_slope(samples, duration_s / 2, duration_s)
    judged = half["mb_per_h"] is not None and duration_s / 2 >= min_mem_window_s
    if judged:
        checks["memory"] = {"pass": half["mb_per_h"] <= max_mem_slope, "judged": True,
                            "detail": f"anonymous {half['mb_per_h']:+.1f} MB/h over the second half ({half['points']} samples "
                                      f"over {half['window_s']:.0f} s); at most {max_mem_slope:g} MB/h"}
    else:
        checks["memory"] = {"pass": True, "judged": False,
                            "detail": f"not judged: the second half lasts {duration_s / 2:.0f} s < "
                                      f"{min_mem_window_s:g} s"
                                      + (f" ({half['mb_per_h']:+.1f} MB/h)" if half["mb_per_h"] is not None else "")}
    load = [s for s in samples if s["phase"] == "load"]
    kv = [s["server"]["kv_blocks_used"] for s in load if "error" not in s["server"]]
    return {
        "pass": all(c["pass"] for c in checks.values()),
        "checks": checks,
        "requests": {"total": tail.total, "by_outcome": dict(tail.by_outcome),
                     "by_tenant": {t: dict(c) for t, c in tail.by_tenant.items()},
                     "unexpected": dict(tail.unexpected), "invalid_sent": tail.invalid_sent,
                     "invalid_by_kind": dict(sorted(tail.invalid_by_kind.items()))},
        "server_counters": None if "error" in srv or "error" in before["server"] else {
            group: {k: srv[group].get(k, 0) - before["server"][group].get(k, 0) for k in srv[group]}
            for group in ("success", "failure")},
        "memory_mb": {"before": before["rss_mb"], "after": after["rss_mb"],
                      "max_under_load": max((s["rss_mb"]["total"] for s in load), default=None),
                      "slope_steady": memory_slope(samples, warmup_s, duration_s),
                      "slope_second_half": half,
                      "rss_slope_second_half": memory_slope(samples, duration_s / 2, duration_s, memory="rss_mb"),
                      "anon_before": before["anon_mb"], "anon_after": after["anon_mb"],
                      "slope_second_half_by_process": {
                          k: memory_slope(samples, duration_s / 2, duration_s, k)["mb_per_h"]
                          for k in ("server", "stubs")},
                      "threshold_mb_per_h": max_mem_slope, "judged": judged},
        "kv_blocks": {"before": before["server"].get("kv_blocks_used"), "after": srv.get("kv_blocks_used"),
                      "max_under_load": max(kv, default=None), "total": srv.get("kv_blocks_total")},
        "fds": {"before": before["fds"], "after": after["fds"], "max_under_load": max((s["fds"] for s in load),
                                                                                      default=None)},
        "threads": {"before": before["threads"], "after": after["threads"],
                    "max_under_load": max((s["threads"] for s in load), default=None)},
    }


# ------------------------------------------------------------------------------------------------
# Plot
# ------------------------------------------------------------------------------------------------


def write_plot(path: Path, samples: list[dict], summary: dict, duration_s: float) -> bool:
    """soak.png: RSS, KV blocks, fds and threads, and requests by outcome over time. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    t = [s["t"] / 60.0 for s in samples]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    ax = axes[0][0]
    for key in ("total", "stubs", "server"):
        ax.plot(t, [s["rss_mb"][key] for s in samples], label=f"RSS {key}", marker=".", ms=3)
    ax.plot(t, [s["anon_mb"]["total"] for s in samples], label="anonymous total", marker=".", ms=3)
    half = summary["memory_mb"]["slope_second_half"]
    ax.set_title(f"memory (MB); anonymous, second half {half['mb_per_h']:+.1f} MB/h"
                 if half["mb_per_h"] is not None else "memory (MB)")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    kv = [(x, s["server"]["kv_blocks_used"]) for x, s in zip(t, samples) if "error" not in s["server"]]
    ax.plot([x for x, _ in kv], [y for _, y in kv], marker=".", ms=3)
    ax.set_title(f"KV blocks in use (of {summary['kv_blocks']['total']:g})" if summary["kv_blocks"]["total"]
                 else "KV blocks in use")
    ax = axes[1][0]
    ax.plot(t, [s["fds"] for s in samples], label="open fds", marker=".", ms=3)
    ax.plot(t, [s["threads"] for s in samples], label="threads", marker=".", ms=3)
    ax.set_title("server + stubs: open fds, threads")
    ax.legend(fontsize=8)
    ax = axes[1][1]
    outcomes = sorted({k for s in samples for k in s["client"]["by_outcome"]})
    for o in outcomes:
        ax.plot(t, [s["client"]["by_outcome"].get(o, 0) for s in samples], label=o, marker=".", ms=3)
    ax.set_title("requests by outcome (cumulative)")
    ax.legend(fontsize=8)
    for ax in axes.ravel():
        ax.axvspan(min(t + [0.0]), 0.0, color="0.9")
        ax.axvline(duration_s / 60.0, color="0.5", lw=0.8, ls="--")
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("minutes from the start of the load (dashed: its end)")
    fig.suptitle(f"soak: {'PASS' if summary['pass'] else 'FAIL'}")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------


def prime(host: str, grpc_url: str, model: str, timeout: float = 120.0) -> None:
    """One short streamed request over HTTP and one over gRPC, before the baseline: the server starts some
    threads and sockets at its first requests (gRPC's first connection adds a thread and a socket to
    tritonserver, the stub starts its metrics thread at its first request), which are no growth."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    params = json.dumps({"max_tokens": 2, "temperature": 0})
    body = json.dumps({"text_input": "Hello", "stream": True, "sampling_parameters": params,
                       "exclude_input_in_output": True}).encode()
    req = urllib.request.Request(f"{_run._http_url(host)}/v2/models/{model}/generate_stream", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()
    done, errors = threading.Event(), []

    def on_response(result, error):
        if error is not None:
            errors.append(error)
            done.set()
        elif result.get_response().parameters["triton_final_response"].bool_param:
            done.set()

    def tensor(name, value, dtype):
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=np.object_ if dtype == "BYTES" else np.bool_))
        return t

    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        client.start_stream(on_response)
        client.async_stream_infer(model, [tensor("text_input", b"Hello", "BYTES"), tensor("stream", True, "BOOL"),
                                          tensor("sampling_parameters", params.encode(), "BYTES")],
                                  enable_empty_final_response=True)
        if not done.wait(timeout) or errors:
            raise RuntimeError(f"the gRPC priming request failed: {errors or 'no final response'}")
    finally:
        client.stop_stream()
        client.close()


def _print_sample(s: dict) -> None:
    srv = s["server"]
    kv = "?" if "error" in srv else f"{srv['kv_blocks_used']:g}/{srv['kv_blocks_total']:g}"
    c = s["client"]
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(c["by_outcome"].items()))
    print(f"[soak {s['t']:7.0f} s {s['phase']:>6}] rss {s['rss_mb']['total']:.0f} MB (server "
          f"{s['rss_mb']['server']:.0f}, stubs {s['rss_mb']['stubs']:.0f}; anonymous {s['anon_mb']['total']:.0f})  "
          f"kv {kv}  fds {s['fds']}  "
          f"threads {s['threads']}  requests {c['requests']} ({outcomes or 'none'}; unexpected {c['unexpected']})",
          flush=True)


def settle(sampler: Sampler, before: dict, timeout_s: float, quiet_polls: int = 3) -> dict:
    """Wait, at most `timeout_s`, until the server reports nothing running or waiting and no KV block in
    use `quiet_polls` times in a row (a second apart; its gauges refresh every 0.5 s), and its processes
    hold no more fds and threads than in `before`: connections closing at the end of the load and
    gRPC's event-engine threads go within seconds, a leak stays. Returns what was reached and when."""
    started = time.monotonic()
    deadline = started + timeout_s
    quiet = 0
    idle = back = False
    while True:
        try:
            m = server_metrics(sampler.metrics_url, sampler.models)
            idle = m["kv_blocks_used"] == 0 and m["running"] == 0 and m["waiting"] == 0
        except (urllib.error.URLError, OSError, ValueError):
            idle = False
        quiet = quiet + 1 if idle else 0
        procs = sample_processes(sampler.server_pid)
        back = (sum(p["fds"] for p in procs) <= before["fds"]
                and sum(p["threads"] for p in procs) <= before["threads"])
        if (quiet >= quiet_polls and back) or time.monotonic() >= deadline:
            return {"idle": quiet >= quiet_polls, "back_to_baseline": back,
                    "seconds": round(time.monotonic() - started, 1)}
        time.sleep(1.0)


def _write(out: Path, doc: dict) -> None:
    tmp = out / (SOAK_FILE + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out / SOAK_FILE)


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        parse_duration = _run.parse_duration
        duration = parse_duration(a.duration)
        interval = parse_duration(a.interval)
        settle_s = parse_duration(a.settle)
        min_window = parse_duration(a.min_mem_window)
        warmup = parse_duration(a.warmup) if a.warmup else min(300.0, max(20.0, duration / 10))
        cfg = load_tenants(a.tenants, model=a.model or None)
    except (ValueError, OSError) as e:
        print(f"soak: {e}", file=sys.stderr)
        return 2
    models = sorted({t.model for t in cfg.tenants})
    users = a.users or sum(t.fixed_count or 1 for t in cfg.tenants)
    launcher = None
    if a.host:
        host = a.host
        hostname = urlparse(_run._http_url(host)).hostname
        grpc_url = a.grpc_url or f"{hostname}:8001"
        metrics_url = a.metrics_url or f"http://{hostname}:8002/metrics"
        if not _run.is_ready(host, models):
            print(f"soak: Triton at {host} is not ready with {models}", file=sys.stderr)
            return 2
        pid = a.server_pid or listening_pid(urlparse(_run._http_url(host)).port or 8000)
        if pid is None:
            print(f"soak: no process on this machine listens at {host}: pass --server-pid", file=sys.stderr)
            return 2
    else:
        from server.serve import free_ports

        http, grpc, metrics = free_ports(3)
        host, grpc_url = f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}"
        launcher = _run.start_server(host, grpc_url, models, a.wait_ready, out / "tritonserver.log", metrics)
        metrics_url, pid = launcher.metrics_url, launcher.process.pid
    doc = None
    try:
        doc = _soak(a, out, host, grpc_url, metrics_url, pid, models, users, duration, interval, warmup, settle_s,
                    min_window)
    finally:
        if launcher is not None:
            print("stopping tritonserver ...", flush=True)
            started = time.monotonic()
            code = launcher.stop()
            if doc is not None:
                doc["summary"]["checks"]["clean_stop"] = clean_stop(code, time.monotonic() - started,
                                                                    out / "tritonserver.log")
    if doc is None:
        return 2
    return finish(out, doc)


def clean_stop(code: int | None, seconds: float, log_path: Path) -> dict:
    """The rule for a server the soak started: it stopped at once and cleanly. A request the model still
    holds after the load (one whose final response was never sent) keeps the model from unloading until
    Triton's exit timeout kills it: "Exit timeout expired" in its log, a non-zero exit."""
    try:
        log = log_path.read_text(errors="replace")
    except OSError:
        log = ""
    stuck = "Exit timeout expired" in log
    return {"pass": code == 0 and not stuck,
            "detail": f"tritonserver exited {code} after {seconds:.1f} s"
                      + ("; its log: 'Exit timeout expired' (the model did not unload)" if stuck else "")}


def finish(out: Path, doc: dict) -> int:
    """Write soak.json and soak.png, print the verdict; the exit status."""
    summary = doc["summary"]
    summary["pass"] = all(c["pass"] for c in summary["checks"].values())
    _write(out, doc)
    plotted = write_plot(out / PLOT_FILE, doc["samples"], summary, doc["settings"]["duration_s"])
    req = summary["requests"]
    print(f"\nsoak: {'PASS' if summary['pass'] else 'FAIL'} ({req['total']} requests: "
          + ", ".join(f"{k} {v}" for k, v in sorted(req["by_outcome"].items())) + ")")
    for name, c in summary["checks"].items():
        print(f"  {'ok  ' if c['pass'] else 'FAIL'} {name:15} {c['detail']}")
    print(f"report: {out / SOAK_FILE}" + (f", {out / PLOT_FILE}" if plotted else "")
          + f" (load test report: {out / 'report.md'})", flush=True)
    return 0 if summary["pass"] else 1


def _soak(a, out: Path, host: str, grpc_url: str, metrics_url: str, pid: int, models: list[str], users: int,
          duration: float, interval: float, warmup: float, settle_s: float, min_window: float) -> dict:
    """Prime, baseline, load with the sampler running, settle, judge: soak.json's document."""
    from loadtest.records import REQUESTS_FILE
    from loadtest.report import write_report

    (out / REQUESTS_FILE).unlink(missing_ok=True)
    tail = RecordTail(out / REQUESTS_FILE)
    sampler = Sampler(pid, metrics_url, models, tail, interval, on_sample=_print_sample)
    settings = {"duration_s": duration, "interval_s": interval, "warmup_s": warmup, "settle_s": settle_s,
                "users": users, "tenants": a.tenants, "host": host, "grpc_url": grpc_url, "metrics_url": metrics_url,
                "server_pid": pid, "models": models, "max_mem_slope_mb_per_h": a.max_mem_slope,
                "min_mem_window_s": min_window, "argv": sys.argv}
    print(f"soak: {duration:g} s of load, {users} users ({a.tenants}) on {host} / {grpc_url}, tritonserver pid {pid}; "
          f"a sample every {interval:g} s", flush=True)
    for model in models:
        prime(host, grpc_url, model, a.request_timeout)
    time.sleep(2.0)  # the priming connections close
    sampler.t0 = time.monotonic()
    before = sampler.take("before")
    run_args = _run.build_parser().parse_args([
        "--host", host, "--grpc-url", grpc_url, "--users", str(users), "--run-time", f"{duration:g}s",
        "--warmup", f"{warmup:g}s", "--tenants", a.tenants, "--request-timeout", str(a.request_timeout),
        "--stop-timeout", f"{a.request_timeout:g}s", "--out", str(out), "--", "--loglevel", "WARNING"]
        + (["--model", a.model] if a.model else []))
    cmd = _run.locust_command(run_args, out)
    sampler.start()
    with open(out / "locust.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait()
        except KeyboardInterrupt:  # stop the load, still judge what was measured
            proc.send_signal(signal.SIGINT)
            rc = proc.wait()
    sampler.stop()
    print(f"soak: load over (locust exit {rc}, its log {out / 'locust.log'}); settling (at most {settle_s:g} s) ...",
          flush=True)
    settled = settle(sampler, before, settle_s)
    after = sampler.take("after")
    summary = verdict(before, after, sampler.samples, tail, duration, warmup, a.max_mem_slope, min_window)
    summary["settle"] = settled
    summary["locust_exit"] = rc
    try:
        load_summary = write_report(out)["overall"] if (out / REQUESTS_FILE).is_file() else None
    except (ValueError, OSError) as e:
        load_summary = {"error": str(e)}
    summary["load_report"] = {"requests_measured": (load_summary or {}).get("requests"),
                              "output_tokens": (load_summary or {}).get("output_tokens"),
                              "output_throughput_tok_s": (load_summary or {}).get("output_throughput_tok_s")}
    doc = {"settings": settings, "summary": summary, "samples": sampler.samples}
    _write(out, doc)  # judged once more by finish(), after the server (if ours) has stopped
    return doc

if __name__ == "__main__":
    sys.exit(main())
