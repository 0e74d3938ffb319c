"""What Triton 2.51 itself does when a model's Python-backend stub is killed (no launcher watchdog).

Starts tritonserver through `TritonLauncher` (the class: `alrkvd-serve`'s stub watchdog lives in its `main`,
so nothing here reacts to the death), runs a gRPC and an HTTP stream, SIGKILLs the model's stub, then
records for `--watch` seconds the readiness of the server and the model, what a new request gets and how
long it takes, what the running streams see (each client gives up after `--client-timeout` s), and how
long a graceful stop takes afterwards. README "Faults" quotes a run.

    python -m benchmarks.fault_stub_kill --out reports/fault_stub_kill.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

from client import complete, stream
from server.model_config import variant_repository
from server.serve import TritonLauncher, free_ports, python_stubs

PROMPT = "Once upon a time, in a small village by the sea,"


def status(url: str) -> int | str:
    try:
        return requests.get(url, timeout=2).status_code
    except requests.RequestException as e:
        return type(e).__name__


def measure(launcher: TritonLauncher, a) -> dict:
    ended: dict[str, dict] = {}
    t0 = [0.0]

    def run(protocol: str):
        url = launcher.grpc_url if protocol == "grpc" else launcher.http_url
        chunks = 0
        try:
            for _ in stream(PROMPT, url=url, protocol=protocol, max_tokens=400, temperature=0, ignore_eos=True,
                            timeout_s=a.client_timeout):
                chunks += 1
            ended[protocol] = {"outcome": "completed", "chunks": chunks}
        except Exception as e:  # noqa: BLE001 - the measurement
            ended[protocol] = {"outcome": str(e)[:160], "chunks": chunks}
        ended[protocol]["after_kill_s"] = round(time.monotonic() - t0[0], 2)

    threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in ("grpc", "http")]
    for t in threads:
        t.start()
    time.sleep(3)
    [(stub, instance)] = python_stubs(launcher.process.pid).items()
    t0[0] = time.monotonic()
    os.kill(stub, signal.SIGKILL)
    readiness = []
    while time.monotonic() - t0[0] < a.watch:
        readiness.append((round(time.monotonic() - t0[0], 1),
                          status(f"http://{launcher.http_url}/v2/health/ready"),
                          status(f"http://{launcher.http_url}/v2/models/smollm2/ready")))
        time.sleep(1.0)
    new = {}
    for protocol, url in (("grpc", launcher.grpc_url), ("http", launcher.http_url)):
        t = time.monotonic()
        try:
            complete(PROMPT, url=url, protocol=protocol, max_tokens=2, timeout_s=30)
            new[protocol] = {"outcome": "served"}
        except Exception as e:  # noqa: BLE001 - the measurement
            new[protocol] = {"outcome": str(e)[:160]}
        new[protocol]["took_s"] = round(time.monotonic() - t, 2)
    for t in threads:
        t.join(timeout=a.client_timeout + 10)
    t_stop = time.monotonic()
    code = launcher.stop()
    return {"killed": instance, "readiness (s after, server, model)": readiness, "new_request": new,
            "running_streams": ended, "stop_s": round(time.monotonic() - t_stop, 1), "tritonserver_exit": code,
            "exit_timeout_s": launcher.exit_timeout_s}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fault_stub_kill", description=__doc__.split("\n\n")[0])
    p.add_argument("--watch", type=float, default=10.0, help="seconds of readiness polls after the kill")
    p.add_argument("--client-timeout", type=float, default=60.0, help="seconds a stream waits for its next response")
    p.add_argument("--exit-timeout", type=int, default=30)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="alrkvd-stub-kill-") as tmp:
        repo = variant_repository(Path(tmp), "smollm2", {"torch_num_threads": "1"})
        http, grpc, metrics = free_ports(3)
        launcher = TritonLauncher(model_repository=repo, models=["smollm2"], http_port=http,
                                  grpc_port=grpc, metrics_port=metrics, exit_timeout_s=a.exit_timeout)
        log_path = Path(tmp) / "tritonserver.log"
        with open(log_path, "wb") as log:
            launcher.start(stdout=log, stderr=log)
        try:
            launcher.wait_until_ready(timeout=900)
            result = measure(launcher, a)  # ends with the server stopped
            result["server_log_tail"] = log_path.read_text(errors="replace").splitlines()[-4:]
        finally:
            launcher.stop()
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
