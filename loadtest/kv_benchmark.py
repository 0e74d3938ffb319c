"""A/B load test of KV-cache formats: one run, the same load on two configs of one model.

    python -m loadtest.kv_benchmark --out loadtest/benchmarks/kv_fp16_vs_alrkvd \
        --steps 2,4,8 --step-time 60s

Each tenant of the tenants file (default loadtest/tenants_kv.yaml) names a model `<base>_<format>`;
this builds a throwaway model repository holding one config per such model: a copy of
model_repository/<base>/config.pbtxt with its name and `kv_format` changed (everything else, and
the model code, shared through a symlink), starts tritonserver on it with the project's launcher,
runs `python -m loadtest.run` (steps shape by default: total users per step, split evenly between
the tenants) and stops the server. The report folder compares the formats per tenant. `--set KEY=VALUE` sets an
engine parameter in every config (e.g. `enable_prefix_caching=true`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import urllib.request
from pathlib import Path

from loadtest import run as lt_run
from loadtest.tenants import load_tenants

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
NAME = re.compile(r'^name:\s*"[^"]*"', re.M)
SERVER_METRICS = "server_metrics.json"


def _parameter(key: str) -> re.Pattern:
    """An engine parameter's entry in config.pbtxt text, its value (a quoted string, escapes included) between the
    two groups."""
    return re.compile(r'(key:\s*"' + re.escape(key) + r'",\s*value:\s*\{\s*string_value:\s*")(?:[^"\\]|\\.)*(")')


def set_parameters(config: str, params: dict) -> str:
    """config.pbtxt text with the engine parameters `params` set: replaced where it has them, else added first.
    Values are escaped as text-format strings (kv_options is JSON, with quotes)."""
    for key, value in params.items():
        value = str(value).replace("\\", "\\\\").replace('"', '\\"')
        config, n = _parameter(key).subn(lambda m: f"{m.group(1)}{value}{m.group(2)}", config, count=1)
        if not n:
            config = config.replace("parameters: [", f'parameters: [\n  {{ key: "{key}", value: {{ string_value: '
                                                      f'"{value}" }} }},', 1)
    return config


def variant_config(base_config: str, name: str, kv_format: str, params: dict[str, str] | None = None) -> str:
    """`base_config` (config.pbtxt text) renamed to `name` with engine parameter kv_format = `kv_format`, and the
    engine parameters `params` set (replaced where the base has them, else added)."""
    if not NAME.search(base_config) or not _parameter("kv_format").search(base_config):
        raise ValueError("base config.pbtxt needs a name and a kv_format parameter")
    text = NAME.sub(f'name: "{name}"', base_config, count=1)
    return set_parameters(text, {"kv_format": kv_format, **(params or {})})


def build_repository(models: list[str], root: Path, source: Path = MODEL_REPOSITORY,
                     params: dict[str, str] | None = None) -> Path:
    """A model repository under `root` with one `<base>_<format>` config per name in `models` (engine parameters
    `params` set in each)."""
    repo = root / "model_repository"
    repo.mkdir(parents=True)
    for model in models:
        base, sep, kv_format = model.rpartition("_")
        if not sep or not (source / base / "config.pbtxt").is_file():
            raise SystemExit(f"model {model!r} is not <base>_<kv_format> with a base in {source}")
        d = repo / model
        d.mkdir()
        (d / "config.pbtxt").write_text(variant_config((source / base / "config.pbtxt").read_text(), model, kv_format,
                                                       params))
        (d / "1").symlink_to((source / base / "1").resolve(), target_is_directory=True)
    return repo


def server_gauges(metrics_url: str) -> dict[str, dict[str, float]]:
    """The server's alrkvd:kv_cache_* gauges and token counters (prefix-cache hits too), per model (Prometheus
    text)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    out: dict[str, dict[str, float]] = {}
    for m in re.finditer(r'^alrkvd:(kv_cache_\w+|generation_tokens_total|prompt_tokens_total|'
                         r'prefix_cache_hit_tokens_total)\{([^}]*)\} (\S+)$',
                         text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        out.setdefault(labels.get("model", "?"), {})[m.group(1)] = float(m.group(3))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.kv_benchmark", description=__doc__.split("\n\n")[0])
    p.add_argument("--tenants", default=str(Path(__file__).with_name("tenants_kv.yaml")))
    p.add_argument("--out", default="reports/kv_benchmark")
    p.add_argument("--shape", default="steps", choices=["fixed", "steps", "poisson"])
    p.add_argument("--steps", default="2,4,8", help="total users per step (split evenly between the tenants)")
    p.add_argument("--step-time", default="60s")
    p.add_argument("--users", type=int, default=4)
    p.add_argument("--run-time", default="120s")
    p.add_argument("--rate", type=float, default=0.5)
    p.add_argument("--warmup", default="10s")
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an engine parameter of every config (e.g. enable_prefix_caching=true, kv_budget_bytes=N)")
    a = p.parse_args(argv)
    params = {}
    for kv in a.set:
        key, sep, value = kv.partition("=")
        if not sep:
            p.error(f"--set takes KEY=VALUE, not {kv!r}")
        params[key] = value

    from server.serve import TritonLauncher, free_ports

    models = sorted({t.model for t in load_tenants(a.tenants).tenants})
    with tempfile.TemporaryDirectory(prefix="alrkvd-kvbench-") as tmp:
        repo = build_repository(models, Path(tmp), params=params)
        http, grpc, metrics = free_ports(3)
        launcher = TritonLauncher(model_repository=repo, host="127.0.0.1", http_port=http, grpc_port=grpc,
                                  metrics_port=metrics)
        print(f"starting tritonserver with {', '.join(models)} ...", flush=True)
        log = open(Path(tmp) / "tritonserver.log", "wb")
        launcher.start(stdout=log, stderr=log)
        try:
            launcher.wait_until_ready(a.ready_timeout)
            rc = lt_run.main([
                "--host", f"http://{launcher.http_url}", "--grpc-url", launcher.grpc_url, "--server", "never",
                "--tenants", a.tenants, "--shape", a.shape, "--steps", a.steps, "--step-time", a.step_time,
                "--users", str(a.users), "--run-time", a.run_time, "--rate", str(a.rate), "--warmup", a.warmup,
                "--out", a.out,
            ])
            gauges = server_gauges(launcher.metrics_url)
            (Path(a.out) / SERVER_METRICS).write_text(json.dumps(gauges, indent=1, sort_keys=True) + "\n")
            for model, g in sorted(gauges.items()):
                print(f"{model}: " + ", ".join(f"{k} {v:g}" for k, v in sorted(g.items())))
            return rc
        except Exception:
            log.flush()
            print((Path(tmp) / "tritonserver.log").read_text(errors="replace")[-5000:], file=sys.stderr)
            raise
        finally:
            launcher.stop()
            log.close()


if __name__ == "__main__":
    sys.exit(main())
