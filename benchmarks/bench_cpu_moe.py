"""The CPU's MoE paths on the served `smollm2-moe` config (fp16 weights through FBGEMM, the `alrkvd-cpu` cache): routed
experts as one dense FFN with the routing as a mask (`DenseExperts`, the CPU's choice for tiny experts) against one
matmul per routed expert (the path before it, and the path larger experts keep), with the dense `smollm2` it was split
from as the reference. Decode step time at each batch (prompts of 200 tokens of WikiText-2 test, a different stretch
per sequence) and the time of a 512-token prompt's prefill (`bench_cpu_context.measure`); the engines are loaded once
and measured in turns, `--rounds` times (medians: this shared VM's speed drifts).

    python benchmarks/bench_cpu_moe.py --out benchmarks/results/cpu_moe_dense_2026-12-05/engine.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from backend import model as model_module  # noqa: E402
from backend.engine import EngineArgs, LLMEngine  # noqa: E402
from benchmarks import bench_cpu_context  # noqa: E402
ARMS = {"moe_dense_experts": ("smollm2-moe", None), "moe_one_matmul_per_expert": ("smollm2-moe", 0),
        "dense_smollm2": ("default", None)}


def load(model: str, dense_max: int | None) -> LLMEngine:
    """The served CPU config of `model`; `dense_max` 0: every expert one matmul at a time."""
    limit = model_module.DENSE_EXPERT_MAX_WEIGHTS if dense_max is None else dense_max
    with mock.patch.object(model_module, "DENSE_EXPERT_MAX_WEIGHTS", limit):
        return LLMEngine(EngineArgs(model=model, weight_dtype="float16", kv_format="alrkvd-cpu", max_model_len=2048,
                                    max_num_seqs=8, max_num_batched_tokens=512))


def measure(engine: LLMEngine, ids: list[int], batches: list[int], steps: int) -> dict:
    """Median decode step (ms) at each batch size, and the prefill (ms) of one 512-token prompt."""
    out = {f"decode_ms_batch_{b}": bench_cpu_context.measure(engine, ids, 200, steps, [0.0], b)[0] for b in batches}
    out["prefill_512_ms"] = bench_cpu_context.measure(engine, ids, 512, 1, [0.0])[2]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    engines = {name: load(*arm) for name, arm in ARMS.items()}
    ids = engines["dense_smollm2"].tokenizer.encode(open(bench_cpu_context.TEXT).read()[:60000])
    for e in engines.values():
        measure(e, ids, [1], 2)  # warm-up
    rounds = {name: [] for name in engines}
    for r in range(a.rounds):
        for name, e in engines.items():
            rounds[name].append(measure(e, ids, batches, a.steps))
            print(f"round {r} {name:26s} " + "  ".join(f"{k} {v:.1f}" for k, v in rounds[name][-1].items()),
                  flush=True)
    medians = {name: {k: round(statistics.median(x[k] for x in rs), 1) for k in rs[0]} for name, rs in rounds.items()}
    base = medians["moe_one_matmul_per_expert"]
    print("\nmedians (ms); speed-up of dense experts over one matmul per expert")
    for k in base:
        print(f"  {k:18s} " + "  ".join(f"{n} {m[k]:7.1f}" for n, m in medians.items())
              + f"   {base[k] / medians['moe_dense_experts'][k]:.2f}x")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "machine": "CPU", "command": " ".join(sys.argv),
                       "medians": medians, "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
