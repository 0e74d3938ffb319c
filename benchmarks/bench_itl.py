"""The server's per-token overhead: inter-token latency through Triton vs the engine's own step time.

One greedy stream at a time, `--tokens` tokens, `--rounds` rounds; each round runs, back to back,
the engine in this process (AsyncEngine, the model's config.pbtxt options), then the same request
through a running server over gRPC, over HTTP and through the OpenAI-compatible front (its streamed
/v1/completions, server/openai_front.py), without and with a JSON schema (`response_format`), so slow
drifts in machine load hit all five alike. Reported per path: the median over rounds of each stream's mean gap between tokens, and
model.py's own view of each Triton stream (alrkvd:time_per_output_token_seconds over that
stream): client gap minus model.py gap, on the same tokens, is what Triton's transport adds to
the gaps.

    alrkvd-serve --models smollm2 &        # or make serve
    python -m benchmarks.bench_itl --grpc-url 127.0.0.1:8001 --http-url 127.0.0.1:8000 \
        --openai-url http://127.0.0.1:9000/v1 --out reports/bench_itl.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import requests

from client.api import complete
from server.model_config import model_config

PROMPT = "Once upon a time, in a small village by the sea,"
REPO_ROOT = Path(__file__).resolve().parents[1]


def load_engine(model: str):
    """AsyncEngine with the same options the server's model uses."""
    import importlib.util

    from backend.engine import AsyncEngine, EngineArgs

    spec = importlib.util.spec_from_file_location(
        "engine_config", REPO_ROOT / "model_repository" / model / "1" / "engine_config.py")
    ec = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ec)
    config = model_config(model, REPO_ROOT / "model_repository")  # config.pbtxt's parameters, as Triton hands them
    args = ec.engine_args_from_config(config, str(REPO_ROOT / "model_repository" / model), EngineArgs)
    threads = ec.server_options(config)["torch_num_threads"]  # as model.py does
    if threads > 0:
        import torch

        torch.set_num_threads(threads)
    return AsyncEngine(args)


def engine_gaps(engine, tokens: int, request_id: str) -> list[float]:
    from backend.engine import SamplingParams

    params = SamplingParams.from_dict({"max_tokens": tokens, "temperature": 0, "ignore_eos": True})

    async def run():
        times = []
        async for out in engine.generate(PROMPT, params, request_id):
            if out.new_token_ids:
                times.append(time.perf_counter())
        return [b - a for a, b in zip(times, times[1:])]

    return asyncio.run(run())


# a schema whose one string runs on for as many tokens as asked: every token goes through the grammar's mask
STORY = {"type": "json_schema", "json_schema": {"schema": {
    "type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}}}


def openai_gaps(base_url: str, model: str, tokens: int, response_format: dict | None = None) -> list[float]:
    """Gaps between the streamed chunks that carry text, of one greedy /v1/completions stream."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, **({"response_format": response_format} if response_format else {})}
    times = []
    with requests.post(f"{base_url}/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["text"]:
                times.append(time.perf_counter())
    return [b - a for a, b in zip(times, times[1:])]


def server_tpot(metrics_url: str, model: str) -> tuple[float, float]:
    text = requests.get(metrics_url, timeout=10, headers={"Connection": "close"}).text
    values = []
    for part in ("sum", "count"):
        m = re.search(rf'alrkvd:time_per_output_token_seconds_{part}\{{model="{model}",version="1"\}} (\S+)', text)
        values.append(float(m.group(1)) if m else 0.0)
    return values[0], values[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_itl", description=__doc__.split("\n\n")[0])
    p.add_argument("--grpc-url", default="127.0.0.1:8001")
    p.add_argument("--http-url", default="127.0.0.1:8000")
    p.add_argument("--metrics-url", default=None, help="default: the HTTP host, port 8002")
    p.add_argument("--openai-url", default="http://127.0.0.1:9000/v1", help="the OpenAI-compatible front")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--start-server", action="store_true",
                   help="start tritonserver (this model only) on free loopback ports, stop it at the end")
    args = p.parse_args(argv)
    launcher = front = None
    if args.start_server:
        from server.serve import free_ports, start_openai_front, stop_process

        launcher = start_server(args.model)
        args.grpc_url, args.http_url, args.metrics_url = launcher.grpc_url, launcher.http_url, launcher.metrics_url
        port = free_ports(1)[0]
        front = start_openai_front(launcher.grpc_url, [args.model], "127.0.0.1", port)
        args.openai_url = f"http://127.0.0.1:{port}/v1"
    try:
        return run(args)
    finally:
        if front is not None:
            stop_process(front)
        if launcher is not None:
            launcher.stop()


def start_server(model: str):
    from server.serve import TritonLauncher, free_ports

    ports = free_ports(3)
    launcher = TritonLauncher(models=[model], host="127.0.0.1", http_port=ports[0], grpc_port=ports[1],
                              metrics_port=ports[2])
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_itl_tritonserver_{os.getpid()}.log", "wb")
    launcher.start(stdout=log, stderr=log)
    launcher.wait_until_ready(timeout=900)
    return launcher


def run(args) -> int:
    metrics_url = args.metrics_url or f"http://{args.http_url.rsplit(':', 1)[0]}:8002/metrics"

    engine = load_engine(args.model)
    paths = ("grpc", "http", "openai", "openai_json")
    rows = {k: [] for k in ("engine", *paths, *(f"{p}_model_py" for p in paths))}
    for r in range(args.rounds + 1):  # round 0 warms everything up and is dropped
        e = statistics.mean(engine_gaps(engine, args.tokens, f"bench-{r}"))
        per = {}
        for proto, url in (("grpc", args.grpc_url), ("http", args.http_url), ("openai", args.openai_url),
                           ("openai_json", args.openai_url)):
            s0 = server_tpot(metrics_url, args.model)
            if proto.startswith("openai"):
                gaps = openai_gaps(url, args.model, args.tokens, STORY if proto == "openai_json" else None)
            else:
                gaps = complete(PROMPT, url=url, protocol=proto, model=args.model,
                                max_tokens=args.tokens, temperature=0, ignore_eos=True).itl_s
            s1 = server_tpot(metrics_url, args.model)
            # the same tokens seen by the client and by model.py: the difference is Triton's (and the front's)
            per[proto] = (statistics.mean(gaps), (s1[0] - s0[0]) / max(1.0, s1[1] - s0[1]))
        if r == 0:
            continue
        rows["engine"].append(e)
        for proto, (client_itl, model_py) in per.items():
            rows[proto].append(client_itl)
            rows[f"{proto}_model_py"].append(model_py)
        print(f"round {r}: engine {e * 1e3:6.1f} ms | " + " | ".join(
            f"{p} {per[p][0] * 1e3:6.1f} ms (model.py {per[p][1] * 1e3:6.1f})" for p in paths), file=sys.stderr)
    engine.shutdown()
    med = {k: statistics.median(v) for k, v in rows.items()}
    paired = {p: statistics.median([a - b for a, b in zip(rows[p], rows[f"{p}_model_py"])]) for p in paths}
    result = {
        "model": args.model, "tokens": args.tokens, "rounds": args.rounds,
        "load_average": os.getloadavg(), "cpus": os.cpu_count(),
        "mean_gap_s_median_over_rounds": med, "rounds_s": rows,
        # client gap - model.py gap on the same stream: what Triton's transport adds to the gap
        # between tokens (a constant per-token delay does not widen gaps and is not in here)
        "client_minus_model_py_gap_s": paired,
        "vs_engine_alone_s": {p: med[p] - med["engine"] for p in paths},
        # the front against Triton's gRPC stream, round by round (the front talks gRPC to Triton)
        "openai_over_grpc": statistics.median([a / b for a, b in zip(rows["openai"], rows["grpc"])]),
        # structured output's cost per token: the same front with a JSON schema against without
        "json_schema_over_plain": statistics.median([a / b for a, b in zip(rows["openai_json"], rows["openai"])]),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
