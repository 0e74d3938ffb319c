"""Locust entry point: streaming LLM load test of the Triton deployment, one user class per tenant.

    locust -f loadtest/locustfile.py --headless -H http://localhost:8000 -u 4 -t 30s \
        --tenants loadtest/tenants.yaml --shape fixed --out-dir reports/manual
    python -m loadtest.run ...            # the same, then writes the report (see loadtest/run.py)

Distributed: `--master --expect-workers N` here plus N × `locust -f loadtest/locustfile.py --worker
--master-host HOST`; workers receive the master's options and send their request records to the
master, which alone writes requests.jsonl and run.json (see docs/LOADTEST.md, docker-compose.yml).

Options (also from the environment: LOADTEST_<NAME>): --tenants, --shape fixed|steps|poisson,
--steps, --step-time, --rate, --warmup, --grpc-url, --protocol, --model, --seed, --out-dir,
--request-timeout. `-u` is the concurrency (fixed) or the user pool (poisson), `-t` the run time.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import gevent
from locust import __version__ as _locust_version
from locust import events as _events
from locust.runners import MasterRunner as _MasterRunner
from locust.runners import WorkerRunner as _WorkerRunner

from loadtest import records as _records
from loadtest import shapes as _shapes
from loadtest import tenants as _tenants
from loadtest import users as _users

DEFAULT_TENANTS = str(Path(__file__).with_name("tenants.yaml"))
DEFAULT_HOST = "http://localhost:8000"
RECORDS_MESSAGE = "loadtest_records"


@_events.init_command_line_parser.add_listener
def _add_options(parser):
    g = parser.add_argument_group("loadtest", "Streaming LLM load test (loadtest/locustfile.py)")
    g.add_argument("--tenants", default=DEFAULT_TENANTS, env_var="LOADTEST_TENANTS", help="tenants YAML file")
    g.add_argument("--shape", default="fixed", choices=sorted(_shapes.SHAPES), env_var="LOADTEST_SHAPE",
                   help="fixed: -u users for -t; steps: --steps sweep; poisson: --rate arrivals with a pool of -u users")
    g.add_argument("--steps", default="1,2,4", env_var="LOADTEST_STEPS", help="users per step, e.g. 1,2,4,8")
    g.add_argument("--step-time", default="20s", env_var="LOADTEST_STEP_TIME", help="duration of each step")
    g.add_argument("--rate", type=float, default=1.0, env_var="LOADTEST_RATE", help="Poisson arrivals per second")
    g.add_argument("--warmup", default="5s", env_var="LOADTEST_WARMUP",
                   help="requests sent this early are recorded but left out of the report; Locust stats reset then")
    g.add_argument("--grpc-url", default="", env_var="LOADTEST_GRPC_URL",
                   help="host:port of Triton's gRPC endpoint (default: the --host name, port 8001)")
    g.add_argument("--openai-url", default="", env_var="LOADTEST_OPENAI_URL",
                   help="base URL of the OpenAI-compatible front (default: the --host name, port 9000, /v1)")
    g.add_argument("--protocol", default="", choices=["", "grpc", "http", "openai"], env_var="LOADTEST_PROTOCOL",
                   help="force every tenant onto one protocol")
    g.add_argument("--model", default="", env_var="LOADTEST_MODEL", help="force every tenant onto one model")
    g.add_argument("--seed", type=int, default=None, env_var="LOADTEST_SEED", help="override the tenants file seed")
    g.add_argument("--out-dir", default="reports/locust", env_var="LOADTEST_OUT_DIR",
                   help="where requests.jsonl and run.json go (master / single process)")
    g.add_argument("--request-timeout", type=float, default=120.0, env_var="LOADTEST_REQUEST_TIMEOUT",
                   help="seconds before a request counts as a timeout failure")


def default_grpc_url(host: str | None) -> str:
    u = urlparse(host if host and "://" in host else f"http://{host or 'localhost'}")
    return f"{u.hostname or 'localhost'}:8001"


def load_config(opts) -> _tenants.TenantsConfig:
    return _tenants.load_tenants(opts.tenants, seed=opts.seed, protocol=opts.protocol or None,
                                 model=opts.model or None)


def user_classes(cfg: _tenants.TenantsConfig) -> list[type]:
    shares = [t.fixed_count or t.weight for t in cfg.tenants]
    return [_users.tenant_user_class(t, s / sum(shares)) for t, s in zip(cfg.tenants, shares)]


def _configure(environment, cfg: _tenants.TenantsConfig) -> None:
    opts = environment.parsed_options
    environment.user_classes = user_classes(cfg)
    environment.host = environment.host or DEFAULT_HOST
    for cls in environment.user_classes:
        cls.host = environment.host
    state: _users.RunState = environment.loadtest
    state.grpc_url = opts.grpc_url or default_grpc_url(environment.host)
    state.openai_url = opts.openai_url or f"http://{default_grpc_url(environment.host).rsplit(':', 1)[0]}:9000/v1"
    state.request_timeout = float(opts.request_timeout)
    state.warmup_s = _shapes.parse_duration(opts.warmup)
    state.arrival_rate = float(opts.rate) if opts.shape == "poisson" else 0.0
    environment.loadtest_config = cfg


class _WorkerSink:
    """On a worker: batches records and sends them to the master once a second and at test stop."""

    def __init__(self, runner):
        self.runner = runner
        self.buf: list[dict] = []
        self.loop = gevent.spawn(self._loop)

    def write(self, rec: dict) -> None:
        self.buf.append(rec)

    def flush(self) -> None:
        batch, self.buf = self.buf, []
        if batch:
            self.runner.send_message(RECORDS_MESSAGE, batch)

    def _loop(self):
        while True:
            gevent.sleep(1.0)
            self.flush()


@_events.init.add_listener
def _on_init(environment, runner=None, **_kw):
    opts = environment.parsed_options
    environment.loadtest = _users.RunState(grpc_url="")
    environment.loadtest_writer = None
    _configure(environment, load_config(opts))
    if isinstance(runner, _WorkerRunner):
        sink = _WorkerSink(runner)
        environment.loadtest.write = sink.write
        environment.loadtest_sink = sink
        return
    if isinstance(runner, _MasterRunner):
        def on_records(environment, msg, **_kw):
            if environment.loadtest_writer is not None:
                environment.loadtest_writer.write_many(msg.data)

        runner.register_message(RECORDS_MESSAGE, on_records)
    if runner is not None:
        shape = _shapes.shape_from_options(opts)
        shape.runner = runner
        environment.shape_class = shape


@_events.test_start.add_listener
def _on_test_start(environment, **_kw):
    opts, runner, state = environment.parsed_options, environment.runner, environment.loadtest
    if isinstance(runner, _WorkerRunner):
        # The master's options arrived with the spawn message: use its tenants, seed, shape.
        _configure(environment, load_config(opts))
        state.worker_index = runner.worker_index
        state.worker_count = max(1, int(getattr(opts, "expect_workers", 1) or 1))
    state.begin()
    if isinstance(runner, _WorkerRunner):
        return
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / _records.REQUESTS_FILE).unlink(missing_ok=True)
    if environment.loadtest_writer is not None:
        environment.loadtest_writer.close()
    writer = _records.JsonlWriter(out / _records.REQUESTS_FILE)
    environment.loadtest_writer = writer
    if not isinstance(runner, _MasterRunner):
        state.write = writer.write
    shape = environment.shape_class
    started = time.time()
    if shape is not None:  # the shape's clock is what the plan's stage times refer to
        started -= time.perf_counter() - shape.start_time
    environment.loadtest_meta = {
        "started": started,
        "warmup_s": state.warmup_s,
        "plan": shape.plan() if shape is not None and hasattr(shape, "plan") else {},
        "host": environment.host,
        "grpc_url": state.grpc_url,
        "request_timeout_s": state.request_timeout,
        "workers": int(opts.expect_workers) if isinstance(runner, _MasterRunner) else 1,
        "tenants": environment.loadtest_config.to_dict(),
        "seed": environment.loadtest_config.seed,
        "locust_version": _locust_version,
        "argv": sys.argv,
        "pid": os.getpid(),
    }
    _records.write_run_meta(out, environment.loadtest_meta)
    if state.warmup_s > 0 and runner is not None:
        gevent.spawn_later(state.warmup_s, runner.stats.reset_all)


@_events.test_stop.add_listener
def _on_test_stop(environment, **_kw):
    if isinstance(environment.runner, _WorkerRunner):
        environment.loadtest_sink.flush()  # reaches the master before this worker's "client_stopped"
        return
    meta = getattr(environment, "loadtest_meta", None)
    if meta is not None:
        meta["ended"] = time.time()
        _records.write_run_meta(environment.parsed_options.out_dir, meta)
    # Every user has stopped (and every worker has flushed its records) by the time test_stop fires.
    if environment.loadtest_writer is not None:
        environment.loadtest_writer.close()
        environment.loadtest_writer = None


# Locust looks for user classes when it imports this file, before options exist: offer the tenants
# of $LOADTEST_TENANTS (or the default file) now; the init hook rebuilds them from --tenants.
for _cls in user_classes(_tenants.load_tenants(os.environ.get("LOADTEST_TENANTS", DEFAULT_TENANTS))):
    globals()[_cls.__name__] = _cls
del _cls


if __name__ == "__main__":
    from locust import run_single_user

    run_single_user(next(c for c in globals().values() if isinstance(c, type) and issubclass(c, _users.LLMUser)
                         and not c.abstract))
