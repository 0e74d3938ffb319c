"""Run a headless Locust load test against the Triton deployment, then write its report.

    python -m loadtest.run --host http://localhost:8000 --users 4 --run-time 30s --shape fixed \
        --tenants loadtest/tenants.yaml --out reports/smoke
    python -m loadtest.run --shape steps --steps 1,2,4,8 --step-time 30s --out reports/sweep
    python -m loadtest.run --shape poisson --rate 2 --users 16 --run-time 2m --out reports/poisson
    python -m loadtest.run --report-only --out reports/smoke      # recompute the report from the raw files

The test itself is the ordinary `locust` command line on loadtest/locustfile.py (printed before it
starts; add any Locust option after `--`), so a run here and a hand-started or distributed run
(`--processes N`, or `--master` + workers) behave the same. The report folder holds requests.jsonl
(every request, the source of truth), run.json, summary.json, report.md, PNG plots, Locust's own
locust.html / locust_*.csv, and where the server's /metrics answers, server_steps.json (how many engine steps ran
and how many tokens each took, preemptions; and its readings through the run, from which the report gives each stage
of users its engine steps: a step's time in the server beside the inter-token gaps the clients saw). Exit status:
Locust's (1 when any request failed), 2 on a bad setup.

With no server ready at --host, one is started through the project's launcher (server.serve) with
the tenants' models on the --host / --grpc-url ports and stopped at the end (`--server never`
refuses instead). `make loadtest` is `python -m loadtest.run --out reports/loadtest` (2 users, 20 s).

`run_inprocess()` runs the same test through Locust's library API inside the calling process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
DEFAULT_TENANTS = Path(__file__).with_name("tenants.yaml")
_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*$")


def parse_duration(text: str | float | int) -> float:
    """'90', '90s', '1m30s', '1h' -> seconds (the shapes' and the soak's durations; no Locust here)."""
    if isinstance(text, (int, float)):
        return float(text)
    m = _DURATION.match(str(text))
    if not m or not any(m.groups()):
        raise ValueError(f"bad duration {text!r} (e.g. 30s, 2m, 1m30s)")
    h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    return h * 3600 + mi * 60 + s


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m loadtest.run", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default=env("LOADTEST_HOST", "http://localhost:8000"),
                   help="Triton HTTP base URL (env LOADTEST_HOST)")
    p.add_argument("--grpc-url", default=env("LOADTEST_GRPC_URL", ""),
                   help="Triton gRPC host:port (env LOADTEST_GRPC_URL; default: host name, port 8001)")
    p.add_argument("--users", "-u", type=int, default=2, help="concurrency (fixed) or user pool (poisson)")
    p.add_argument("--spawn-rate", "-r", type=float, default=0.0, help="users started per second (0: all at once)")
    p.add_argument("--run-time", "-t", default="20s", help="duration of fixed/poisson runs, e.g. 30s, 2m")
    p.add_argument("--shape", choices=["fixed", "steps", "poisson"], default="fixed")
    p.add_argument("--steps", default="1,2,4", help="steps shape: users per step")
    p.add_argument("--step-time", default="20s", help="steps shape: duration of each step")
    p.add_argument("--rate", type=float, default=1.0, help="poisson shape: arrivals per second")
    p.add_argument("--warmup", default="3s", help="requests sent this early are left out of the report")
    p.add_argument("--tenants", default=env("LOADTEST_TENANTS", str(DEFAULT_TENANTS)), help="tenants YAML file")
    p.add_argument("--protocol", choices=["", "grpc", "http"], default="", help="force every tenant's protocol")
    p.add_argument("--model", default="", help="force every tenant's model")
    p.add_argument("--seed", type=int, default=None, help="override the tenants file seed")
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--stop-timeout", default="60s", help="at the end, in-flight requests get this long to finish")
    p.add_argument("--processes", type=int, default=0, help="Locust worker processes on this machine (0: one process)")
    p.add_argument("--server", choices=["auto", "never", "always"], default=env("LOADTEST_SERVER", "auto"),
                   help="auto: start tritonserver (alrkvd-serve's launcher) on the --host/--grpc-url ports when "
                        "nothing answers there; always: start one in any case; never: fail instead")
    p.add_argument("--wait-ready", type=float, default=900.0, help="seconds to wait for the server to be ready")
    p.add_argument("--metrics-url", default="", help="the server's /metrics, read before and after the run for its "
                   "engine steps (server_steps.json; default: the host name, the HTTP port + 2)")
    p.add_argument("--out", default=env("LOADTEST_OUT", "reports/loadtest"), help="report folder (env LOADTEST_OUT)")
    p.add_argument("--report-only", action="store_true", help="only rewrite the report from the folder's raw files")
    p.add_argument("locust_args", nargs=argparse.REMAINDER, help="after --: passed to locust unchanged")
    return p


def locust_command(a: argparse.Namespace, out: Path) -> list[str]:
    """The `locust` command line for these options."""
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
           "--host", a.host, "--users", str(a.users if a.shape != "steps" else max(int(s) for s in a.steps.split(","))),
           "--run-time", a.run_time, "--stop-timeout", a.stop_timeout,
           "--shape", a.shape, "--steps", a.steps, "--step-time", a.step_time, "--rate", str(a.rate),
           "--warmup", a.warmup, "--tenants", a.tenants, "--request-timeout", str(a.request_timeout),
           "--out-dir", str(out), "--html", str(out / "locust.html"), "--csv", str(out / "locust")]
    if a.spawn_rate:
        cmd += ["--spawn-rate", str(a.spawn_rate)]
    if a.grpc_url:
        cmd += ["--grpc-url", a.grpc_url]
    if a.protocol:
        cmd += ["--protocol", a.protocol]
    if a.model:
        cmd += ["--model", a.model]
    if a.seed is not None:
        cmd += ["--seed", str(a.seed)]
    if a.processes:
        cmd += ["--processes", str(a.processes)]
    extra = list(a.locust_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    return cmd + extra


def _http_url(host: str) -> str:
    return (host if "://" in host else f"http://{host}").rstrip("/")


def is_ready(host: str, models: list[str] = (), timeout: float = 2.0) -> bool:
    urls = [f"{_http_url(host)}/v2/health/ready"] + [f"{_http_url(host)}/v2/models/{m}/ready" for m in models]
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                if r.status != 200:
                    return False
        except (urllib.error.URLError, OSError, ValueError):
            return False
    return True


def start_server(host: str, grpc_url: str, models: list[str], timeout: float, log_path: Path,
                 metrics_port: int | None = None):
    """Start tritonserver with the project's launcher (server.serve) on the ports of `host` / `grpc_url`
    (metrics: `metrics_port`, default the HTTP port + 2); its output goes to `log_path`."""
    from server.serve import LaunchError, TritonLauncher

    u = urlparse(_http_url(host))
    if u.hostname not in ("localhost", "127.0.0.1", "0.0.0.0", "::1"):
        raise SystemExit(f"no server at {host}, and one can only be started on this machine")
    http_port = u.port or 8000
    grpc_port = int(grpc_url.rsplit(":", 1)[1]) if grpc_url else 8001
    if metrics_port is None:
        metrics_port = http_port + 2 if http_port + 2 != grpc_port else http_port + 3
    launcher = TritonLauncher(models=models, host="127.0.0.1", http_port=http_port, grpc_port=grpc_port,
                              metrics_port=metrics_port)
    print(f"starting tritonserver with {', '.join(models)} on HTTP {http_port}, gRPC {grpc_port} "
          f"(log: {log_path}) ...", flush=True)
    with open(log_path, "ab") as log:
        launcher.start(stdout=log, stderr=log)
    try:
        launcher.wait_until_ready(timeout)
    except LaunchError as e:
        launcher.stop()
        raise SystemExit(f"tritonserver did not start: {e} (see {log_path})") from None
    return launcher


def run_inprocess(locust_args: list[str]) -> int:
    """Run the load test with Locust's library API in this process; returns 1 if any request failed.

    `locust_args` are the locustfile's command line options (as for `locust -f loadtest/locustfile.py`,
    without --headless / -f). Importing Locust monkey-patches this process for gevent: call it from
    a process of its own (the tests start one).
    """
    import gevent
    from locust import events
    from locust.argument_parser import parse_options
    from locust.env import Environment

    from loadtest import locustfile

    opts = parse_options(["-f", str(LOCUSTFILE), "--headless", *locust_args])
    env = Environment(user_classes=locustfile.user_classes(locustfile.load_config(opts)), events=events,
                      host=opts.host, parsed_options=opts, stop_timeout=opts.stop_timeout)
    runner = env.create_local_runner()
    events.init.fire(environment=env, runner=runner, web_ui=None)
    try:
        runner.start_shape()
        runner.shape_greenlet.join()
    finally:
        runner.quit()
        gevent.sleep(0)
    # Locust's live statistics (after the warm-up reset), to compare with the exact report.
    live = [{"type": e.method, "name": e.name, "num_requests": e.num_requests, "num_failures": e.num_failures,
             "median_ms": e.median_response_time, "total_content_length": e.total_content_length}
            for e in runner.stats.entries.values()]
    Path(opts.out_dir, "locust_stats.json").write_text(json.dumps(live, indent=1) + "\n", encoding="utf-8")
    return 1 if runner.stats.total.num_failures else 0


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    out = Path(a.out)
    if a.report_only:
        from loadtest.report import write_report

        write_report(out)
        print(f"report: {out / 'report.md'}")
        return 0
    if not Path(a.tenants).is_file():
        print(f"tenants file {a.tenants} not found", file=sys.stderr)
        return 2
    from loadtest.tenants import load_tenants

    models = sorted({t.model for t in load_tenants(a.tenants, model=a.model or None).tenants})
    launcher = None
    ready = a.server != "always" and is_ready(a.host, models)
    if not ready and a.server == "never":
        print(f"Triton at {a.host} is not ready with {models} (start it: make serve)", file=sys.stderr)
        return 2
    if not ready:
        out.mkdir(parents=True, exist_ok=True)
        launcher = start_server(a.host, a.grpc_url, models, a.wait_ready, out / "tritonserver.log")
    try:
        return _run(a, out, models)
    finally:
        if launcher is not None:
            print("stopping tritonserver ...", flush=True)
            launcher.stop()


def _run(a: argparse.Namespace, out: Path, models: list[str]) -> int:
    from loadtest.report import STEPS_FILE, steps_between, write_report  # no gevent here: Locust runs in a child

    out.mkdir(parents=True, exist_ok=True)
    cmd = locust_command(a, out)
    metrics_url = a.metrics_url or _default_metrics_url(a.host)
    before = engine_steps(metrics_url, models)
    readings, done = [], threading.Event()  # (wall time, engine_steps) every second of the run

    def read_steps():
        while not done.wait(STEP_READING_S):
            reading = engine_steps(metrics_url, models)
            if reading is not None:
                readings.append((time.time(), reading))

    reader = threading.Thread(target=read_steps, daemon=True)
    if before is not None:
        reader.start()
    print("+", shlex.join(cmd), flush=True)
    rc = subprocess.call(cmd)
    done.set()
    after = engine_steps(metrics_url, models)
    steps = steps_between(before, after)
    if steps is not None:  # (before the report, which reads its readings)
        reader.join()
        steps["readings"] = [[t, {k: r[k] for k in STEP_KEYS}] for t, r in readings]
        (out / STEPS_FILE).write_text(json.dumps(steps, indent=1) + "\n")
    if not (out / "requests.jsonl").is_file():
        print(f"locust exited with {rc} and recorded no requests", file=sys.stderr)
        return rc or 2
    s = write_report(out)
    o = s["overall"]
    print(f"\n{o['requests']} measured requests ({o['failed']} failed), TTFT p50 {o['ttft_ms']['p50'] or 0:.1f} ms, "
          f"ITL p50 {o['itl_ms']['p50'] or 0:.1f} ms, TPOT p50 {o['tpot_ms']['p50'] or 0:.1f} ms, "
          f"{o['output_throughput_tok_s'] or 0:.1f} output tok/s, goodput {100 * (o['goodput']['share'] or 0):.0f} %")
    if steps is not None:
        print(f"engine: {steps['steps']} steps of {steps['mean_tokens']:.0f} tokens and {steps['mean_ms']:.1f} ms on "
              f"average (half of them at most {steps['p50_tokens_at_most']:g} tokens), {steps['preemptions']} "
              f"preemptions, {steps['prefix_cache_hit_tokens']} of {steps['prompt_tokens']} prompt tokens from the "
              f"prefix cache (server_steps.json)")
    print(f"report: {out / 'report.md'} (summary.json, plots, requests.jsonl in {out})")
    return rc


def _default_metrics_url(host: str) -> str:
    u = urlparse(_http_url(host))
    return f"http://{u.hostname}:{(u.port or 80) + 2}/metrics"


STEP_READING_S = 1.0  # the server's /metrics read this often during a run (it logs its steps every 0.5 s)
STEP_KEYS = ("steps", "preemptions", "prompt_tokens", "prefix_cache_hit_tokens")  # what `steps_between` reads


def engine_steps(metrics_url: str, models: list[str]) -> dict | None:
    """The server's /metrics for `models` (`loadtest.soak.server_metrics`: its steps' tokens and preemptions among
    them); None where it does not answer or counts no steps (another server)."""
    from loadtest.soak import server_metrics

    try:
        m = server_metrics(metrics_url, models)
    except (OSError, ValueError):
        return None
    return m if m["steps"]["le"] else None


if __name__ == "__main__":
    sys.exit(main())
