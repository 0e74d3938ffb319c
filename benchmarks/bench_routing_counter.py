"""What counting routed tokens (`MoE.routed_tokens`, behind alrkvd:moe_expert_load_imbalance) costs inside the
CUDA-graph decode step: dummy Qwen3-30B-A3B, fp16 KV, context 4k, batch 1 and 8; one engine, graphs captured with
and without the counters, the two arms interleaved four times (median step of each).

    python benchmarks/bench_routing_counter.py [--out FILE.json]      # on the GPU machine
"""
import argparse
import json
import statistics

from backend.cuda_graphs import StepGraphs
from benchmarks.bench_engine import ExpertCounter, dummy_engine, run_decode


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out")
    a = p.parse_args()
    engine = dummy_engine("qwen3-30b-a3b", "fp16", kv_budget_bytes=8 << 30, max_num_seqs=8)
    counter = ExpertCounter(engine.model)
    counters = [m.routed_tokens for m in engine.moe_layers]

    def use(arm: str):
        for m, c in zip(engine.moe_layers, counters):
            m.routed_tokens = c if arm == "count" else None

    graphs = {}
    for arm in ("count", "none"):
        use(arm)
        graphs[arm] = StepGraphs(engine.model, engine.cache, 8, engine.max_model_len)
        graphs[arm].capture_all()
    rows = []
    for batch in (1, 8):
        ms = {"count": [], "none": []}
        for _ in range(4):
            for arm in ("count", "none"):
                use(arm)
                engine.graphs = graphs[arm]
                ms[arm].append(run_decode(engine, counter, batch, 4096, 20, 4.0e12)["step_ms"])
        row = {"batch": batch, "count_ms": statistics.median(ms["count"]), "none_ms": statistics.median(ms["none"]),
               "all": ms}
        row["ratio"] = row["count_ms"] / row["none_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{'batch':>5} {'with counters ms':>17} {'without ms':>11} {'ratio':>6}")
    for r in rows:
        print(f"{r['batch']:>5} {r['count_ms']:17.3f} {r['none_ms']:11.3f} {r['ratio']:6.3f}")


if __name__ == "__main__":
    main()
