"""The trace arm's threads at the 32-user stage (the last 20 s of records; journal 2026-12-07 42a):
    python benchmarks/results/async_scheduling_2026-12-07/call3_h100/trace_an.py \
        benchmarks/results/async_scheduling_2026-12-07/call3_h100/trace.jsonl.gz
"""
import gzip, json, sys
import numpy as np
recs = [json.loads(l) for l in gzip.open(sys.argv[1], "rt")]
t_end = max(r[2] if r[0] in ("step", "take", "metric") else r[1] for r in recs)
lo = t_end - float(sys.argv[2]) if len(sys.argv) > 2 else t_end - 20
by = {}
for r in recs:
    if r[1] >= lo:
        by.setdefault(r[0], []).append(r)
for k, v in by.items():
    print(k, len(v))
steps = np.array([(r[1], r[2], r[3], r[4], r[5], r[6], r[7]) for r in by["step"]], dtype=float)
dur = (steps[:, 1] - steps[:, 0]) * 1e3
idle = (steps[1:, 0] - steps[:-1, 1]) * 1e3
print(f"steps {len(steps)}: dur p50 {np.median(dur):.1f} p90 {np.percentile(dur,90):.1f} p99 {np.percentile(dur,99):.1f} max {dur.max():.1f}; "
      f"between steps p50 {np.median(idle):.2f} p99 {np.percentile(idle,99):.2f} max {idle.max():.1f} ms")
for name, mask in [("queued", steps[:, 5] == 1), ("layered", steps[:, 4] == 1), ("prompt", steps[:, 3] > 0),
                   ("plain", (steps[:, 5] == 0) & (steps[:, 4] == 0) & (steps[:, 3] == 0))]:
    if mask.any():
        print(f"  {name}: {mask.sum()} steps, dur p50 {np.median(dur[mask]):.1f} p99 {np.percentile(dur[mask],99):.1f}")
take = np.array([(r[1], r[2]) for r in by["take"]])
tw = (take[:, 1] - take[:, 0]) * 1e3
print(f"take wait p50 {np.median(tw):.1f} p99 {np.percentile(tw,99):.1f}")
dl = np.array([(r[1], r[2]) for r in by["deliver"] + by["launch"]]); dl = dl[np.argsort(dl[:, 0])]
dl = dl[dl[:, 1] > 0]
gaps = np.diff(dl[:, 0]) * 1e3
print(f"hand-overs with outputs {len(dl)}: gap p50 {np.median(gaps):.1f} p99 {np.percentile(gaps,99):.1f} max {gaps.max():.1f}")
out = np.array([r[1] for r in by["out"]]); send = np.array([r[1] for r in by["send"]])
qs = np.array([r[2] for r in by["send"]])
print(f"response queue at each get: p50 {np.median(qs):.0f} p90 {np.percentile(qs,90):.0f} p99 {np.percentile(qs,99):.0f} max {qs.max()}")
# event loop lag: each hand-over's outputs vs the 'out' events after it
lag = []
j = 0
for t, n in dl:
    while j < len(out) and out[j] < t:
        j += 1
    if j + int(n) - 1 < len(out):
        lag.append((out[j + int(n) - 1] - t) * 1e3)
lag = np.array(lag)
print(f"hand-over -> last 'out' of it: p50 {np.median(lag):.1f} p90 {np.percentile(lag,90):.1f} p99 {np.percentile(lag,99):.1f} max {lag.max():.1f} ms")
met = np.array([(r[2] - r[1]) * 1e3 for r in by.get("metric", [])])
if len(met):
    kinds = [r[3] for r in by["metric"]]
    for k in sorted(set(kinds)):
        m = met[np.array(kinds) == k]
        print(f"metric {k}: {len(m)}, p50 {np.median(m):.3f} p99 {np.percentile(m,99):.2f} max {m.max():.1f} ms, sum {m.sum():.0f} ms")
ex = np.array([r[1] for r in by.get("exec", [])])
print(f"exec {len(ex)} ({len(ex)/20:.1f}/s)")
# stalls: hand-over gaps over 1.6x median, what was around
big = np.where(gaps > 1.6 * np.median(gaps))[0]
print(f"long hand-over gaps {len(big)} ({len(big)/20:.1f}/s)")
for i in big[:12]:
    t0, t1 = dl[i, 0], dl[i + 1, 0]
    ev = [r for r in recs if t0 - 0.002 <= r[1] <= t1 and (r[0] in ("step", "exec", "take") or r[0] == "metric" and r[3] in ("finished", "refresh"))]
    print(f"  gap {gaps[i]:.1f} ms:", "; ".join(f"{r[0]}@{(r[1]-t0)*1e3:.1f}" + (f"-{(r[2]-t0)*1e3:.1f}" if r[0] in ("step","take","metric") else "") + (f" {r[3:]}" if r[0]=="step" else "") for r in ev))
