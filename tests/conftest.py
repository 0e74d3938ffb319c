"""Shared fixtures.

`triton_server` (session): one real tritonserver on the repository's model_repository, started
through our launcher (`python -m server.serve`) on free loopback ports, shared by every test
that asks for it, and stopped cleanly (SIGTERM to the launcher) at the end. A failing test that
used it gets the tail of the server log in its report.

    def test_x(triton_server):
        triton_server.http_url      # "127.0.0.1:PORT"
        triton_server.grpc_url      # "127.0.0.1:PORT"
        triton_server.metrics_url   # "http://127.0.0.1:PORT/metrics"
        triton_server.model         # "smollm2"

Environment: ALRKVD_TEST_MODELS="smollm2" loads only those models (default: all of them);
ALRKVD_TEST_READY_TIMEOUT seconds to wait for the models (default 900).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
DEFAULT_MODEL = "smollm2"
STOP_TIMEOUT_S = 90

_server: "TritonServer | None" = None


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on the loopback (held together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class TritonServer:
    http_url: str
    grpc_url: str
    metrics_url: str
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


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory) -> TritonServer:
    global _server
    from server.serve import LaunchError, wait_until_ready

    models = tuple(os.environ.get("ALRKVD_TEST_MODELS", "").split()) or _all_models()
    timeout = float(os.environ.get("ALRKVD_TEST_READY_TIMEOUT", "900"))
    http, grpc, metrics = free_ports(3)
    log_path = tmp_path_factory.mktemp("tritonserver") / "tritonserver.log"
    cmd = [sys.executable, "-m", "server.serve", "--host", "127.0.0.1",
           "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
           "--ready-timeout", str(timeout), "--exit-timeout", "15", "--models", *models]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = TritonServer(
        http_url=f"127.0.0.1:{http}", grpc_url=f"127.0.0.1:{grpc}",
        metrics_url=f"http://127.0.0.1:{metrics}/metrics",
        model=DEFAULT_MODEL if DEFAULT_MODEL in models else models[0], models=models,
        log_path=log_path, process=proc,
    )
    start = time.monotonic()
    try:
        wait_until_ready(server.http_url, list(models), timeout, proc)
    except LaunchError as e:
        server.stop()
        pytest.fail(f"tritonserver did not start: {e}\n--- server log ---\n{server.log_tail(200)}",
                    pytrace=False)
    print(f"\n[triton_server] ready in {time.monotonic() - start:.0f} s: {server.http_url}, "
          f"log {log_path}", file=sys.stderr)
    _server = server
    yield server
    _server = None
    code = server.stop()
    # a clean stop: the launcher exits 0 and no server or stub process is left behind (the server
    # leads its own session, which its Python-backend stubs share)
    pid = re.search(r"tritonserver pid (\d+)", log_path.read_text(errors="replace"))
    leftover = subprocess.run(["pgrep", "-s", pid.group(1)], capture_output=True,
                              text=True).stdout.split() if pid else []
    assert code == 0 and not leftover, (
        f"tritonserver did not stop cleanly (launcher exit {code}, left {leftover})\n{server.log_tail(80)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and _server is not None and "triton_server" in getattr(item, "fixturenames", ()):
        report.sections.append(("tritonserver log (tail)", _server.log_tail()))
