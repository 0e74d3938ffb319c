"""Helpers of the tests against real servers: /metrics as numbers, waiting for a condition."""

from __future__ import annotations

import re
import time

import requests

CLOSE = {"Connection": "close"}  # no idle keep-alive connections to hold up the server's stop


def scrape(server) -> dict[tuple[str, frozenset], float]:
    """/metrics as {(name, labels): value}."""
    out = {}
    for line in requests.get(server.metrics_url, timeout=10, headers=CLOSE).text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([^{\s]+)(?:\{(.*)\})?\s+(\S+)$", line)
        if not m:
            continue
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def metric(samples, name: str, model: str, **labels) -> float:
    want = {("model", model), *labels.items()}
    for (n, ls), v in samples.items():
        if n == name and want <= ls:
            return v
    raise KeyError(f"{name} {labels} for {model} not on /metrics")


def assert_dropped_stream_frees_blocks(server, start_stream, timeout: float = 20.0) -> None:
    """A stream of `start_stream()` (an iterator with close()), dropped after its fourth chunk while its request holds
    KV blocks: the request ends `cancelled` and every block comes back."""
    model = server.model
    cancelled0 = metric(scrape(server), "alrkvd:request_success_total", model, finished_reason="cancelled")
    gen = start_stream()
    for i, _ in enumerate(gen):
        if i == 3:
            break
    used_during = wait_for(lambda: metric(scrape(server), "alrkvd:kv_cache_blocks_used", model) > 0, timeout=5)
    gen.close()
    assert used_during, "the running stream should hold KV blocks"

    def freed():
        s = scrape(server)
        return (metric(s, "alrkvd:kv_cache_blocks_used", model) == 0
                and metric(s, "alrkvd:request_success_total", model, finished_reason="cancelled") == cancelled0 + 1)

    assert wait_for(freed, timeout=timeout), "the dropped stream's request did not free its KV blocks"


def wait_for(predicate, timeout=20.0, interval=0.25):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
