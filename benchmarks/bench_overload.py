"""Overload: open-loop arrivals above a small server's capacity, then recovery.

A throwaway repository serves smollm2 with `--max-num-seqs` running + `--max-queue-size` waiting (default
2 + 2) and one torch thread. First `--baseline` requests one at a time (the unloaded latency); then
Poisson arrivals at `--rate` per second for `--seconds` (each a streamed HTTP request of `--tokens`
greedy tokens, on a thread of its own); then, once every request has ended, one more request and the
time the server took to be idle again. Reported: arrivals, accepted and refused per second, how long a
refusal took, and time to first token / end to end of the accepted requests against the unloaded ones
(one at a time) and those at capacity (`--max-num-seqs` at once, nothing waiting, nothing refused).

    python -m benchmarks.bench_overload --rate 4 --seconds 20 --out reports/bench_overload.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

from client import ServerError, complete
from server.model_config import variant_repository
from server.serve import TritonLauncher, free_ports

PROMPT = "Once upon a time, in a small village by the sea,"


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    v = sorted(values)
    return {"p50": round(v[len(v) // 2], 3), "p90": round(v[int(len(v) * 0.9)], 3), "max": round(v[-1], 3), "n": len(v)}


def one(url: str, tokens: int) -> dict:
    t0 = time.perf_counter()
    try:
        r = complete(PROMPT, url=url, protocol="http", max_tokens=tokens, temperature=0, ignore_eos=True)
        return {"accepted": True, "ttft_s": r.ttft_s, "e2e_s": r.e2e_s, "finish_reason": r.finish_reason}
    except ServerError as e:
        return {"accepted": False, "queue_full": "queue is full" in e.message, "refusal_s": time.perf_counter() - t0}


def gauges(metrics_url: str) -> dict:
    out = {}
    for line in requests.get(metrics_url, timeout=10).text.splitlines():
        for name in ("kv_cache_blocks_used", "num_requests_running", "num_requests_waiting"):
            if line.startswith(f"alrkvd:{name}{{"):
                out[name] = float(line.rsplit(" ", 1)[1])
    return out


def run(a, launcher: TritonLauncher) -> dict:
    url = launcher.http_url
    one(url, 4)  # warm-up
    baseline = [one(url, a.tokens) for _ in range(a.baseline)]
    full = []  # max_num_seqs at once: the server busy, no arrival refused
    for _ in range(a.baseline):
        batch = [None] * a.max_num_seqs
        pair = [threading.Thread(target=lambda i=i: batch.__setitem__(i, one(url, a.tokens)))
                for i in range(a.max_num_seqs)]
        for th in pair:
            th.start()
        for th in pair:
            th.join()
        full += batch
    rng = random.Random(a.seed)
    results, threads = [], []
    lock = threading.Lock()

    def arrive():
        r = one(url, a.tokens)
        with lock:
            results.append(r)

    start = time.perf_counter()
    t = start
    while t - start < a.seconds:
        th = threading.Thread(target=arrive, daemon=True)
        th.start()
        threads.append(th)
        t += rng.expovariate(a.rate)
        time.sleep(max(0.0, t - time.perf_counter()))
    last_arrival = time.perf_counter()
    for th in threads:
        th.join(timeout=600)
    t_idle = None
    while t_idle is None and time.perf_counter() - last_arrival < 120:
        g = gauges(launcher.metrics_url)
        if g and not any(g.values()):
            t_idle = time.perf_counter()
        else:
            time.sleep(0.1)
    after = one(url, a.tokens)
    accepted = [r for r in results if r["accepted"]]
    refused = [r for r in results if not r["accepted"]]
    span = last_arrival - start
    return {
        "capacity": {"max_num_seqs": a.max_num_seqs, "max_queue_size": a.max_queue_size},
        "tokens": a.tokens, "rate_per_s": a.rate, "seconds": round(span, 1),
        "arrivals": len(results), "accepted": len(accepted), "refused": len(refused),
        "refused_not_queue_full": sum(not r["queue_full"] for r in refused),
        "accepted_per_s": round(len(accepted) / span, 2), "refused_per_s": round(len(refused) / span, 2),
        "refusal_s": percentiles([r["refusal_s"] for r in refused]),
        "unloaded": {"ttft_s": percentiles([r["ttft_s"] for r in baseline]),
                     "e2e_s": percentiles([r["e2e_s"] for r in baseline])},
        "at_capacity": {"ttft_s": percentiles([r["ttft_s"] for r in full]),
                        "e2e_s": percentiles([r["e2e_s"] for r in full])},
        "accepted_under_overload": {"ttft_s": percentiles([r["ttft_s"] for r in accepted]),
                                    "e2e_s": percentiles([r["e2e_s"] for r in accepted])},
        "all_accepted_finished": all(r["finish_reason"] == "length" for r in accepted),
        "idle_after_last_arrival_s": None if t_idle is None else round(t_idle - last_arrival, 2),
        "after": {k: round(v, 3) if isinstance(v, float) else v for k, v in after.items()},
        "e2e_after_vs_unloaded": round(after.get("e2e_s", float("nan")) /
                                       statistics.median(r["e2e_s"] for r in baseline), 2),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_overload", description=__doc__.split("\n\n")[0])
    p.add_argument("--max-num-seqs", type=int, default=2)
    p.add_argument("--max-queue-size", type=int, default=2)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--rate", type=float, default=4.0, help="arrivals per second (Poisson)")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--baseline", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="alrkvd-overload-") as tmp:
        repo = variant_repository(Path(tmp), "smollm2", {"max_num_seqs": str(a.max_num_seqs),
                                                         "max_queue_size": str(a.max_queue_size),
                                                         "torch_num_threads": "1"})
        http, grpc, metrics = free_ports(3)
        launcher = TritonLauncher(model_repository=repo, models=["smollm2"], http_port=http,
                                  grpc_port=grpc, metrics_port=metrics)
        log_path = Path(tmp) / "tritonserver.log"
        with open(log_path, "wb") as log:
            launcher.start(stdout=log, stderr=log)
        try:
            launcher.wait_until_ready(timeout=900)
            result = run(a, launcher)
        except Exception:
            print(log_path.read_text(errors="replace")[-4000:], file=sys.stderr)
            raise
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
