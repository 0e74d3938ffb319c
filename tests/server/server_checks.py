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


def wait_for(predicate, timeout=20.0, interval=0.25):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
