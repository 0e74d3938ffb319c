"""The default deployment (smollm2_moe) under the default tenants at 1 / 4 / 8 users: max_step_ms 300 (the new
default) against 1000, one server, one config after the other."""
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, "/work/main")
from benchmarks.bench_stall_free import write_variant
from loadtest import run as lt_run
from server.serve import TritonLauncher, free_ports
out = Path(sys.argv[1])
arms = {"smollm2_moe_target300": {"max_step_ms": 300}, "smollm2_moe_target1000": {"max_step_ms": 1000}}
with tempfile.TemporaryDirectory() as tmp:
    repo = Path(tmp) / "model_repository"
    for name, params in arms.items():
        write_variant(repo, "smollm2_moe", name, params)
    http, grpc, metrics = free_ports(3)
    launcher = TritonLauncher(model_repository=repo, host="127.0.0.1", http_port=http, grpc_port=grpc,
                              metrics_port=metrics)
    log = open(Path(tmp) / "tritonserver.log", "wb")
    launcher.start(stdout=log, stderr=log)
    try:
        launcher.wait_until_ready(900)
        for name in arms:
            rc = lt_run.main(["--host", f"http://{launcher.http_url}", "--grpc-url", launcher.grpc_url,
                              "--server", "never", "--tenants", "/work/main/loadtest/tenants.yaml", "--model", name,
                              "--shape", "steps", "--steps", "1,4,8", "--step-time", "60s", "--out", str(out / name)])
            assert rc == 0, rc
    finally:
        launcher.stop()
