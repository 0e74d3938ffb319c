"""The fewest expert bytes any cache can copy for the streamed Qwen3-30B-A3B of BENCHMARKS.md section 3: the offline
optimum (Belady: evict the expert needed again latest; no policy, prefetching or not, loads fewer experts of one size)
against LRU, on the engine's `--routing local` tables (backend/model.py `local_routes`, LOCALITY, the seeds of
`seed_routing` with seed 0) for a sequence decoding 1,024 tokens, each of the 48 MoE layers (128 experts, top 8),
caches of 25 / 50 / 75% of a layer's experts (journal 2026-12-05 22c). From the repository root:
    PYTHONPATH=. python benchmarks/results/expert_bound_cpu_2026-12-05/belady_qwen3_local.py
"""
import numpy as np
from backend.model import local_routes
from backend.engine import LOCALITY
from benchmarks.moe_routing import cache_hit_rate
E, k, L, T = 128, 8, 48, 1024
res = {p: {f: [] for f in (0.25, 0.5, 0.75)} for p in ("lru", "belady")}
for i in range(L):
    ids = local_routes(E, k, T, *LOCALITY, seed=0 * 1009 + i)
    for f in (0.25, 0.5, 0.75):
        for p in ("lru", "belady"):
            res[p][f].append(cache_hit_rate(ids, int(E * f), p))
per_expert = 3 * 2048 * 768 * 2
for f in (0.25, 0.5, 0.75):
    lru, bel = np.mean(res["lru"][f]), np.mean(res["belady"][f])
    gb = (1 - bel) * k * L * per_expert / 1e9
    print(f"{f:.0%}: LRU {lru:.3f}, Belady {bel:.3f}; Belady's misses {gb:.3f} GB a token, {gb / 48.3 * 1e3:.1f} ms at 48.3 GB/s")
