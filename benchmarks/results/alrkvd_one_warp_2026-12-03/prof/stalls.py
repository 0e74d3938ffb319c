"""Stall samples of an Nsight Compute source page (profile_alrkvd.py writes it as source_sass.csv; 2.5 MB, not kept):
the share of each stall reason, and of samples and executed instructions by opcode, with shared-memory wavefronts.

    python benchmarks/results/alrkvd_one_warp_2026-12-03/prof/stalls.py source_sass.csv > stalls.txt"""
import collections
import csv
import re
import sys

rows = list(csv.reader(open(sys.argv[1])))
head = rows[1]
data = [r for r in rows[2:] if len(r) == len(head)]
col = {n: i for i, n in enumerate(head)}


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(r):
    m = re.match(r"(@!?U?P\w+\s+)?([A-Z0-9_]+)", r[col["Source"]].strip())
    return m.group(2) if m else "?"


reasons = [n for n in head if n.startswith("stall_") and "(" not in n]
total = collections.Counter({n: sum(num(r[col[n]]) for r in data) for n in reasons})
print("stall reason: share of samples")
for n, v in total.most_common():
    if v:
        print(f"  {n:24s} {100 * v / sum(total.values()):5.1f}%")
for n in ("stall_wait", "stall_short_sb", "stall_long_sb", "stall_no_inst"):
    by = collections.Counter()
    for r in data:
        by[opcode(r)] += num(r[col[n]])
    print(f"{n} by opcode:", ", ".join(f"{o} {100 * v / sum(by.values()):.0f}%" for o, v in by.most_common(6)))
samples, executed, wf, ideal = (collections.Counter() for _ in range(4))
for r in data:
    o = opcode(r)
    samples[o] += num(r[col["Warp Stall Sampling (All Samples)"]])
    executed[o] += num(r[col["Instructions Executed"]])
    wf[o] += num(r[col["L1 Wavefronts Shared"]])
    ideal[o] += num(r[col["L1 Wavefronts Shared Ideal"]])
print("opcode: % of samples, % of executed, shared wavefronts (ideal)")
for o, v in samples.most_common(20):
    print(f"  {o:8s} {100 * v / sum(samples.values()):5.1f} {100 * executed[o] / sum(executed.values()):5.1f}"
          + (f"  {wf[o]:.0f} ({ideal[o]:.0f})" if wf[o] else ""))
