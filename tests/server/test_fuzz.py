"""A short fuzz run (loadtest/fuzz.py) against the real tritonserver (the session `triton_server` fixture).

A few hundred malformed and random requests over HTTP (/generate, /generate_stream, /infer) and gRPC
(ModelStreamInfer, ModelInfer): every answer a success or a clear refusal (4xx / INVALID_ARGUMENT / a
stream error with a message; Triton's own HTTP front-end errors counted apart), never a hang, a dropped
connection or one of our INTERNAL errors; a good request succeeds after every batch, and the engine is
idle afterwards (no request left running, no KV block held). `make fuzz` runs thousands of cases.
ALRKVD_FUZZ_CASES / ALRKVD_FUZZ_SEED change the run; a failing case replays alone with
`python -m loadtest.fuzz --http-url ... --grpc-url ... --seed S --only I -v`.
"""

from __future__ import annotations

import json
import os
import re
import time

import requests

from client import complete
from loadtest.fuzz import ALLOWED, run_fuzz

CASES = int(os.environ.get("ALRKVD_FUZZ_CASES", "200"))
SEED = int(os.environ.get("ALRKVD_FUZZ_SEED", "0"))


def gauge(server, name: str) -> float:
    text = requests.get(server.metrics_url, timeout=10, headers={"Connection": "close"}).text
    line = rf'^{re.escape(name)}\{{[^}}]*model="{server.model}"[^}}]*\}} (\S+)$'
    values = [float(m.group(1)) for m in re.finditer(line, text, re.M)]
    assert values, f"{name} not on /metrics"
    return sum(values)


def test_fuzz_answers_clearly_and_keeps_serving(triton_server):
    summary = run_fuzz(triton_server.http_url, triton_server.grpc_url, triton_server.model, cases=CASES,
                       seed=SEED, check_every=50, timeout=120.0, workers=2)
    report = json.dumps({k: summary[k] for k in ("seed", "outcomes", "by_kind", "checks", "examples")},
                        indent=1, ensure_ascii=False)[:6000]
    assert sum(summary["outcomes"].values()) == CASES
    assert all(n == 0 for o, n in summary["outcomes"].items() if o not in ALLOWED), report
    assert summary["checks"]["failed"] == 0 and summary["checks"]["run"] >= 2 * (CASES // 50), report
    # the fuzz reached the engine too, not only the refusals
    assert summary["outcomes"]["ok"] >= CASES // 10 and summary["outcomes"]["invalid"] >= CASES // 4, report

    deadline = time.monotonic() + 60
    while (gauge(triton_server, "alrkvd:num_requests_running") or gauge(triton_server, "alrkvd:kv_cache_blocks_used")) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert gauge(triton_server, "alrkvd:num_requests_running") == 0
    assert gauge(triton_server, "alrkvd:kv_cache_blocks_used") == 0
    for protocol, url in (("grpc", triton_server.grpc_url), ("http", triton_server.http_url)):
        r = complete("Hello", url=url, protocol=protocol, model=triton_server.model, max_tokens=2,
                     temperature=0, ignore_eos=True)
        assert r.num_output_tokens == 2 and r.finish_reason == "length"
