"""Decode steps and prefill of the dense SmolLM2 on the CPU (fp16 weights, `alrkvd-cpu` cache), closed blocks decoded
one layer at a time (`HISTORY_BYTES` 0) against groups of layers, in one process, the arms alternating in four rounds
(medians). From the repository root: `PYTHONPATH=. python benchmarks/results/cpu_history_2026-12-05/history_ab.py`.
Outputs: history_ab_2mb.txt (this file's arms and cases), history_ab_4mb.txt (4 MB against one layer at a time, at
batch 1 and 4, 200 and 1,024 tokens). 2026-12-05, CPU, nothing else running."""
import sys, statistics
sys.path.insert(0, "."); sys.path.insert(0, "benchmarks")
from bench_cpu_context import TEXT, measure
from backend.engine import EngineArgs, LLMEngine
from backend.kv_cache import PagedKVCache
engine = LLMEngine(EngineArgs(model="default", weight_dtype="float16", kv_format="alrkvd-cpu", kv_budget_bytes=128 << 20,
                              max_model_len=2048, max_num_seqs=8))
ids = engine.tokenizer.encode(open(TEXT).read()[:200000])
dt = [0.0]
measure(engine, ids, 64, 2, dt)
arms = {"per_layer": 0, "2MB": 2 << 20}
cases = [(1, 200), (1, 512), (1, 1024), (4, 200), (8, 100)]
res = {(a, c): [] for a in arms for c in cases}
for r in range(4):
    for c in cases:
        for a, nbytes in (arms.items() if r % 2 == 0 else reversed(arms.items())):
            PagedKVCache.HISTORY_BYTES = nbytes
            ms, share, prefill, _ = measure(engine, ids, c[1], 6, dt, c[0])
            res[(a, c)].append((ms, prefill))
    print("round", r, flush=True)
for c in cases:
    print(c, "  ".join(f"{a} step {statistics.median(x[0] for x in res[(a, c)]):.1f} prefill "
                       f"{statistics.median(x[1] for x in res[(a, c)]):.0f}" for a in arms), flush=True)
