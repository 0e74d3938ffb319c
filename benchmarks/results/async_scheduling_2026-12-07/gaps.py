"""The inter-token gaps of served runs at 32 users (`requests.jsonl[.gz]` of the load test, token-carrying pieces):
the median, the shares far below and far above it, p99 over p50, how often a stall comes (gaps over 1.6x the median,
within 15 ms of each other across streams) against how often a request ends, and one stream's gaps.

    python benchmarks/results/async_scheduling_2026-12-07/gaps.py call2_h100/served/*/requests.jsonl.gz
"""
import gzip
import json
import sys

import numpy as np

for path in sys.argv[1:]:
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        stage = [r for r in map(json.loads, f) if not r["warmup"] and r["users"] == 32]
    for r in stage:
        r["piece_t"] = [t for t, n in zip(r["piece_t"], r["piece_tokens"]) if n > 0]
    stage = [r for r in stage if len(r["piece_t"]) > 1]
    gaps = np.concatenate([np.diff(r["piece_t"]) for r in stage]) * 1e3
    med = np.median(gaps)
    late = np.sort([r["t_start"] + r["piece_t"][i + 1] for r in stage
                    for i in np.where(np.diff(r["piece_t"]) * 1e3 > 1.6 * med)[0]])
    stalls = 1 + np.sum(np.diff(late) > 0.015)
    ends = np.sort([r["t_start"] + r["t_end"] for r in stage])
    longest = max(stage, key=lambda r: len(r["piece_t"]))
    print(f"{path}\n  p50 {med:.1f} ms, under 0.3x {np.mean(gaps < 0.3 * med):.3f}, over 1.7x "
          f"{np.mean(gaps > 1.7 * med):.3f}, p99/p50 {np.percentile(gaps, 99) / med:.2f}; "
          f"{stalls / (late[-1] - late[0]):.1f} stalls/s, {len(ends) / (ends[-1] - ends[0]):.1f} requests ending/s\n"
          f"  a stream: {' '.join(f'{g:.0f}' for g in np.diff(longest['piece_t']) * 1e3)}")
