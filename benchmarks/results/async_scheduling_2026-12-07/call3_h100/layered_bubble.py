"""Issue 33 (journal 2026-12-08 43c): from call 3's trace of the queued `fp16` arm (trace.jsonl.gz, trace_probe.py),
each kind of engine step's wall time, its wait for its tokens (`take`) and, in a layered step, the time from that
wait's end to the launch of its group of layers: the device idles then, the decodes done and the group not queued.

    python benchmarks/results/async_scheduling_2026-12-07/call3_h100/layered_bubble.py (run in that folder)
"""
import gzip
import json

import numpy as np

with gzip.open("trace.jsonl.gz", "rt") as f:
    events = sorted((r for r in map(json.loads, f) if r[0] in ("step", "take", "launch")), key=lambda r: r[1])
kinds = {"layered": [], "queued": [], "other": []}
for s in (r for r in events if r[0] == "step"):  # ("step", t0, t1, decodes, prompt tokens, layered, queued, outputs)
    inside = [r for r in events if s[1] <= r[1] <= s[2] and r[0] != "step"]
    takes = [r for r in inside if r[0] == "take"]
    if not takes:
        continue
    kind = "layered" if s[5] else "queued" if s[6] else "other"
    launches = [r[1] for r in inside if r[0] == "launch" and r[1] >= takes[0][2]]
    idle = launches[0] - takes[0][2] if kind == "layered" and launches else np.nan
    kinds[kind].append((s[2] - s[1], takes[0][2] - takes[0][1], idle, s[3]))
for kind, rows in kinds.items():
    a = np.array(rows) * [1e3, 1e3, 1e3, 1]
    idle = a[~np.isnan(a[:, 2]), 2]  # (layered steps with no launch after their wait left out)
    print(f"{kind}: {len(a)} steps, wall p50 {np.median(a[:, 0]):.1f} ms, token wait p50 {np.median(a[:, 1]):.1f}, "
          f"decodes p50 {np.median(a[:, 3]):.0f}" + (f"; tokens read -> group launched ({len(idle)}) p50 "
                                                      f"{np.median(idle):.2f} p90 {np.percentile(idle, 90):.2f} ms"
                                                      if len(idle) else ""))
