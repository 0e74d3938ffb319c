"""Stream gaps over 0.5 s in a run's requests.jsonl (the book's "28 gaps against 1", journal 2026-12-05 20c): when
each began (seconds from the run's first request), how long, which tenant. From the repository root:
    python benchmarks/results/serving_long_h100_2026-12-05d/gaps.py benchmarks/results/serving_long_h100_2026-12-05d/alrkvd_pieces_4051ec3
"""
import json
import sys

for folder in sys.argv[1:]:
    records = [json.loads(line) for line in open(f"{folder}/requests.jsonl")]
    t0 = min(r["t_start"] for r in records)
    gaps = sorted((round(r["t_start"] - t0 + a, 1), round(b - a, 2), r["tenant"])
                  for r in records for a, b in zip(r["piece_t"], r["piece_t"][1:]) if b - a > 0.5)
    print(folder, len(gaps), "gaps over 0.5 s:", gaps)
