"""Stall-free batching under load: the same Locust load (loadtest/tenants_mixed.yaml: chats streaming
while documents arrive) against the dense `smollm2` config (`alrkvd-cpu` KV; `--model smollm2_moe`: the default
deployment's) without `max_step_ms`, then with it (an arm per target of `--target-ms`; with `--target-ratio`, a step
target relative to the decode step instead), one server, one run.
The chat tenant's inter-token latency p99 against its p50 says whether prompts stall streams.

    python -m benchmarks.bench_stall_free --target-ms 150 --users 6 --run-time 180s --out reports/stall_free
    python -m benchmarks.bench_stall_free --target-ms 1000,500 ...   # an arm per target
    python -m benchmarks.bench_stall_free --model smollm2_moe --tenants loadtest/tenants.yaml --target-ms 300,1000 \
        --steps 1,4,8 --step-time 60s     # the default tenants, users in steps
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from loadtest import run as lt_run
from loadtest.kv_benchmark import set_parameters
from server.serve import TritonLauncher, free_ports

REPO_ROOT = Path(__file__).resolve().parents[1]
REPOSITORY = REPO_ROOT / "model_repository"


def write_variant(repo: Path, base: str, name: str, params: dict) -> None:
    text = (REPOSITORY / base / "config.pbtxt").read_text().replace(f'name: "{base}"', f'name: "{name}"')
    text = set_parameters(text, params)
    (repo / name).mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(text)
    (repo / name / "1").symlink_to((REPOSITORY / base / "1").resolve(), target_is_directory=True)


def arm_figures(summary_path: Path) -> dict:
    """An arm's figures from its load test's summary: per tenant (streams' inter-token p50 / p99, first token, share
    of requests within the tenant's SLO) and, with the steps shape, per step of users."""
    summary = json.loads(summary_path.read_text())

    def figures(s: dict) -> dict:
        itl = s["itl_ms"]
        return {"requests": s["ok"], "failed": s["failed"], "itl_p50_ms": itl["p50"], "itl_p99_ms": itl["p99"],
                "itl_p99_over_p50": itl["p99"] / itl["p50"] if itl["count"] else None,
                "ttft_p50_ms": s["ttft_ms"]["p50"], "ttft_p90_ms": s["ttft_ms"]["p90"],
                "within_slo": s["goodput"]["share"], "output_tok_s": s.get("output_throughput_tok_s")}

    if not all(t["ok"] for t in summary["tenants"].values()):
        raise SystemExit(f"{summary_path}: a tenant finished no request; run longer (--run-time)")
    return {"tenants": {name: figures(t) for name, t in summary["tenants"].items()},
            "by_users": {str(c["users"]): figures(c["overall"]) for c in summary.get("by_concurrency", [])}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_stall_free", description=__doc__.split("\n\n")[0])
    p.add_argument("--target-ms", required=True,
                   help="max_step_ms of the stall-free arms, a comma list (an arm each: MODEL_target<ms>)")
    p.add_argument("--target-ratio", type=float, help="also an arm with this max_step_ratio (and no max_step_ms)")
    p.add_argument("--model", default="smollm2", help="the model_repository config the arms vary (smollm2_moe: the "
                   "default deployment's)")
    p.add_argument("--users", type=int, default=6)
    p.add_argument("--run-time", default="180s")
    p.add_argument("--steps", help="a steps shape instead (users a step, e.g. 1,4,8), each --step-time long")
    p.add_argument("--step-time", default="60s")
    p.add_argument("--warmup", default="20s")
    p.add_argument("--tenants", default=str(REPO_ROOT / "loadtest" / "tenants_mixed.yaml"))
    p.add_argument("--out", type=Path, default=Path("reports/stall_free"))
    a = p.parse_args(argv)
    targets = [float(t) for t in a.target_ms.split(",")]
    arms = {f"{a.model}_base": {"max_step_ms": "none"}}
    arms.update((f"{a.model}_target{t:g}", {"max_step_ms": t}) for t in targets)
    if a.target_ratio is not None:
        arms[f"{a.model}_ratio"] = {"max_step_ms": "none", "max_step_ratio": a.target_ratio}
    results = {}
    with tempfile.TemporaryDirectory(prefix="alrkvd-stallfree-") as tmp:
        repo = Path(tmp) / "model_repository"
        for name, params in arms.items():
            write_variant(repo, a.model, name, params)
        http, grpc, metrics = free_ports(3)
        launcher = TritonLauncher(model_repository=repo, host="127.0.0.1", http_port=http, grpc_port=grpc,
                                  metrics_port=metrics)
        log = open(Path(tmp) / "tritonserver.log", "wb")
        launcher.start(stdout=log, stderr=log)
        try:
            launcher.wait_until_ready(900)
            for name in arms:  # one after the other: the arms never share the CPU
                shape = (["--shape", "steps", "--steps", a.steps, "--step-time", a.step_time] if a.steps else
                         ["--shape", "fixed", "--users", str(a.users), "--run-time", a.run_time])
                rc = lt_run.main(["--host", f"http://{launcher.http_url}", "--grpc-url", launcher.grpc_url,
                                  "--server", "never", "--tenants", a.tenants, "--model", name, *shape,
                                  "--warmup", a.warmup, "--out", str(a.out / name)])
                if rc != 0:
                    raise SystemExit(f"load test against {name} failed ({rc})")
                results[name] = {"params": arms[name], **arm_figures(a.out / name / "summary.json")}
        finally:
            launcher.stop()
    load = {"steps": a.steps, "step_time": a.step_time} if a.steps else {"users": a.users, "run_time": a.run_time}
    (a.out / "summary.json").write_text(json.dumps({**load, "tenants_file": a.tenants, "arms": results},
                                                   indent=1) + "\n")
    print(f"{'arm':<24} {'tenant or users':<16} {'ITL p50':>8} {'p99':>7} {'p99/p50':>7} {'TTFT p50':>9} {'p90':>7} "
          f"{'in SLO':>6} {'tok/s':>6}")
    for name, r in results.items():
        for key, f in [*r["tenants"].items(), *((f"{u} users", f) for u, f in r["by_users"].items())]:
            print(f"{name:<24} {key:<16} {f['itl_p50_ms']:>8.0f} {f['itl_p99_ms']:>7.0f} {f['itl_p99_over_p50']:>7.1f} "
                  f"{f['ttft_p50_ms']:>9.0f} {f['ttft_p90_ms']:>7.0f} {f['within_slo']:>6.0%} "
                  f"{f['output_tok_s'] or 0:>6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
