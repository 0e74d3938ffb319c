"""Shared fixtures.

`triton_server` (session): one real tritonserver on the repository's model_repository, started
through our launcher (`python -m server.serve`) on free loopback ports, shared by every test
that asks for it, and stopped cleanly (SIGTERM to the launcher) at the end. A failing test that
used it gets the tail of the server log in its report.

    def test_x(triton_server):
        triton_server.http_url      # "127.0.0.1:PORT"
        triton_server.grpc_url      # "127.0.0.1:PORT"
        triton_server.metrics_url   # "http://127.0.0.1:PORT/metrics"
        triton_server.openai_url    # "http://127.0.0.1:PORT/v1" (the OpenAI-compatible front)
        triton_server.model         # "smollm2"

Environment: ALRKVD_TEST_MODELS="smollm2" loads only those models (default: all of them);
ALRKVD_TEST_READY_TIMEOUT seconds to wait for the models (default 900).

`start_server(...)` starts another server the same way (a test repository, its own environment), for
tests that need one of their own (tests/server/test_faults.py: they stop or break theirs).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kernels.testing import use_interpreter_without_gpu

# Before any test module imports the engine: its kernels are then interpreted on CPU in every test order.
use_interpreter_without_gpu()

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
DEFAULT_MODEL = "smollm2"
STOP_TIMEOUT_S = 90


@dataclass
class TritonServer:
    http_url: str
    grpc_url: str
    metrics_url: str
    openai_url: str  # "http://127.0.0.1:PORT/v1": the OpenAI-compatible front
    model: str
    models: tuple[str, ...]
    log_path: Path
    process: subprocess.Popen = field(repr=False)

    def log_tail(self, lines: int = 150) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError as e:
            return f"(no server log: {e})"
        return "\n".join(text[-lines:])

    @property
    def tritonserver_pid(self) -> int | None:
        """The tritonserver process the launcher started (it prints its pid first)."""
        found = re.search(r"tritonserver pid (\d+)", self.log_path.read_text(errors="replace"))
        return int(found.group(1)) if found else None

    def leftover_processes(self) -> list[str]:
        """Processes of the server's session still alive (tritonserver leads it; its stubs share it)."""
        pid = self.tritonserver_pid
        return subprocess.run(["pgrep", "-s", str(pid)], capture_output=True, text=True).stdout.split() if pid else []

    def stop(self) -> int | None:
        """SIGTERM to the launcher, which stops tritonserver gracefully; SIGKILL as a last resort."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


def _all_models() -> tuple[str, ...]:
    return tuple(sorted(p.name for p in MODEL_REPOSITORY.iterdir() if (p / "config.pbtxt").is_file()))


def start_server(log_dir: Path, models: tuple[str, ...], model_repository: Path = MODEL_REPOSITORY,
                 env: dict[str, str] | None = None, exit_timeout_s: int = 15) -> TritonServer:
    """`python -m server.serve` on free loopback ports, ready (pytest.fail with the log if not).
    `env`: added to this process's environment."""
    from server.serve import LaunchError, free_ports, wait_until_ready

    timeout = float(os.environ.get("ALRKVD_TEST_READY_TIMEOUT", "900"))
    http, grpc, metrics, openai = free_ports(4)
    log_path = log_dir / "tritonserver.log"
    # no --host: the launcher's default (the loopback) is what tests/server/test_server_e2e.py checks
    cmd = [sys.executable, "-m", "server.serve", "--model-repository", str(model_repository),
           "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
           "--openai-port", str(openai),
           "--ready-timeout", str(timeout), "--exit-timeout", str(exit_timeout_s), "--models", *models]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **(env or {})})
    server = TritonServer(
        http_url=f"127.0.0.1:{http}", grpc_url=f"127.0.0.1:{grpc}",
        metrics_url=f"http://127.0.0.1:{metrics}/metrics", openai_url=f"http://127.0.0.1:{openai}/v1",
        model=DEFAULT_MODEL if DEFAULT_MODEL in models else models[0], models=models,
        log_path=log_path, process=proc,
    )
    start = time.monotonic()
    try:
        wait_until_ready(server.http_url, list(models), timeout, proc)
        # the launcher starts the OpenAI front once Triton is ready
        wait_until_ready(f"127.0.0.1:{openai}", [], 60, proc, health_path="/health")
    except LaunchError as e:
        server.stop()
        pytest.fail(f"tritonserver did not start: {e}\n--- server log ---\n{server.log_tail(200)}",
                    pytrace=False)
    print(f"\n[tritonserver] ready in {time.monotonic() - start:.0f} s: {server.http_url}, "
          f"log {log_path}", file=sys.stderr)
    return server


@pytest.fixture(scope="session")
def launch_server():
    """`start_server`, for module fixtures that start a server of their own."""
    return start_server


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory) -> TritonServer:
    models = tuple(os.environ.get("ALRKVD_TEST_MODELS", "").split()) or _all_models()
    server = start_server(tmp_path_factory.mktemp("tritonserver"), models)
    yield server
    code = server.stop()
    # a clean stop: the launcher exits 0 and no server or stub process is left behind (the server
    # leads its own session, which its Python-backend stubs share)
    leftover = server.leftover_processes()
    assert code == 0 and not leftover, (
        f"tritonserver did not stop cleanly (launcher exit {code}, left {leftover})\n{server.log_tail(80)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for name, value in getattr(item, "funcargs", {}).items():
            if isinstance(value, TritonServer):
                report.sections.append((f"tritonserver log (tail): {name}", value.log_tail()))
