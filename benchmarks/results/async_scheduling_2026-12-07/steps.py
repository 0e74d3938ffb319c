"""Issue 33 (journal 2026-12-08 43b): served runs' steps rebuilt from their streams' token times, at 32 users. A step's
tokens reach the client together: token times are cut where two are over 3 ms apart, groups of 16 tokens or more are
steps, and a period is the time from one step to the next. Periods are split by what the step carried: inside some
request's prefill window (its arrival to its first token) or not.

    python benchmarks/results/async_scheduling_2026-12-07/steps.py call4_h100/served/qwen3_30b_async ...
"""
import gzip
import json
import sys

import numpy as np

for arm in sys.argv[1:]:
    with gzip.open(f"{arm}/requests.jsonl.gz", "rt") as f:
        rs = [r for r in map(json.loads, f) if not r["warmup"] and r["users"] == 32 and r["piece_t"]]
    toks = np.sort(np.concatenate([r["t_start"] + np.array([t for t, n in zip(r["piece_t"], r["piece_tokens"]) if n])
                                   for r in rs]))
    cut = np.where(np.diff(toks) > 0.003)[0]
    starts = np.concatenate([[toks[0]], toks[cut + 1]])
    sizes = np.diff(np.concatenate([[0], cut + 1, [len(toks)]]))
    t = starts[sizes >= 16]
    per, t = np.diff(t) * 1e3, t[1:]
    med = np.median(per)
    windows = [(r["t_start"], r["t_start"] + r["piece_t"][0]) for r in rs]
    inside = np.array([any(a <= ti - p / 1e3 and ti <= b + 0.005 for a, b in windows) for ti, p in zip(t, per)])
    slow, over38 = per > 1.6 * med, per > 38
    print(f"{arm}: {len(per)} periods, p50 {med:.1f} ms, p90 {np.percentile(per, 90):.1f}, p99 "
          f"{np.percentile(per, 99):.1f}; over 1.6x p50 {slow.mean():.3f}, of them in a prefill window "
          f"{inside[slow].mean():.2f}\n  in a prefill window ({inside.mean():.2f} of periods): p50 "
          f"{np.median(per[inside]):.1f} p90 {np.percentile(per[inside], 90):.1f}; outside: p50 "
          f"{np.median(per[~inside]):.1f} p90 {np.percentile(per[~inside], 90):.1f}; over 38 ms: {over38.sum()}, "
          f"{inside[over38].mean():.2f} of them in a window")
