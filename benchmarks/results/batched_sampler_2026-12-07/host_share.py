"""The engine's host share of a decode step: engine.step() wall (it reads the tokens, so each step is synchronous)
against the same decode graph replayed back to back, and the step with sampling instead of greedy decoding, with this
sampler and the one before (`git show 6ddd11c:backend/sampling.py > .probe/old_sampling.py`). Run on the GPU machine
from the repository root: `python host_share.py OUT.json` (H100, 2026-12-07, journal 39a)."""
import json, sys, time
import torch
sys.path.insert(0, ".")
from benchmarks.bench_engine import dummy_engine, weight_bytes
from backend.sampling import SamplingParams, sample
from server.dummy_repository import SHAPES
import backend.engine
import importlib.util
spec = importlib.util.spec_from_file_location("old_sampling", ".probe/old_sampling.py")
old_sampling = importlib.util.module_from_spec(spec)
sys.modules["old_sampling"] = old_sampling
spec.loader.exec_module(old_sampling)
new_sample = backend.engine.sample

out = sys.argv[1]
rows = []
budget = min(16 << 30, torch.cuda.mem_get_info()[0] - weight_bytes(SHAPES["qwen3-30b-a3b"]) - (6 << 30))
engine = dummy_engine("qwen3-30b-a3b", "fp16", kv_budget_bytes=budget, max_num_seqs=64)
SAMPLINGS = {"greedy": dict(temperature=0), "t1": dict(temperature=1.0),
             "t0.8_p0.95": dict(temperature=0.8, top_p=0.95), "t0.8_k50": dict(temperature=0.8, top_k=50),
             "t1_seed": dict(temperature=1.0, seed=7)}


class Skip:
    def replay(self):
        pass


def timed(fn, n=30):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


for B, L in [(1, 4096), (8, 4096), (32, 4096)]:
    for name, sp in SAMPLINGS.items():
        if name != "greedy" and B == 8:
            continue
        cache = engine.cache
        rids = []
        for i in range(B):
            rid = engine.add_request(None, SamplingParams(max_tokens=400, ignore_eos=True, **sp),
                                     prompt_ids=[1] * (L - 100))
            seq = engine.requests[rid]
            cache.allocate(seq.kv, L - 101)
            seq.kv.num_tokens = L - 101
            rids.append(rid)
        engine.waiting, engine.running = [], [engine.requests[r] for r in rids]
        errors = [o.error for _ in range(5) for o in engine.step() if getattr(o, "error", None)]
        row = dict(batch=B, context=L, sampling=name, gpu=torch.cuda.get_device_name())
        if errors:
            row["error"] = errors[0]
            print(json.dumps(row), flush=True)
            rows.append(row)
            for r in rids:
                if r in engine.requests:
                    engine.abort(r)
            continue
        row["step_ms"] = timed(engine.step)
        graph, hidden = engine.graphs.graphs[("decode", B)]
        if name == "greedy":
            row["replay_ms"] = timed(graph.replay)
            engine.graphs.graphs[("decode", B)] = (Skip(), hidden)
            row["step_without_replay_ms"] = timed(engine.step)
            engine.graphs.graphs[("decode", B)] = (graph, hidden)
        logits = engine.model.logits(hidden[:B])
        seqs = [engine.requests[r] for r in rids]
        row["sample_ms"] = timed(lambda: sample(logits, [s.params for s in seqs], [s.generator for s in seqs]))
        if name != "greedy":  # the sampler before (a row at a time, a sync each), same engine, same requests
            backend.engine.sample = old_sampling.sample
            row["step_ms_old_sampler"] = timed(engine.step)
            backend.engine.sample = new_sample
            row["sample_ms_old"] = timed(lambda: old_sampling.sample(logits, [s.params for s in seqs],
                                                                     [s.generator for s in seqs]))
            if name == "t1_seed":  # as the engine made its generators before: on the CPU
                cpu_gens = [torch.Generator().manual_seed(7) for _ in seqs]
                got = old_sampling.sample(logits, [s.params for s in seqs], cpu_gens)
                row["old_cpu_generator"] = repr(got[0])[:200]
        print(json.dumps(row), flush=True)
        rows.append(row)
        for r in rids:
            engine.abort(r)
json.dump(rows, open(out, "w"), indent=1)
print("| B | sampling | step ms | replay ms | step without replay ms | sample() ms | old: step ms | sample() ms |")
for r in rows:
    if "error" in r:
        print(f"| {r['batch']} | {r['sampling']} | error: {r['error'][:100]} |")
        continue
    print(f"| {r['batch']} | {r['sampling']} | {r['step_ms']:.2f} | {r.get('replay_ms', 0):.2f} | "
          f"{r.get('step_without_replay_ms', 0):.2f} | {r['sample_ms']:.2f} | {r.get('step_ms_old_sampler', 0):.2f} | "
          f"{r.get('sample_ms_old', 0):.2f} | {r.get('old_cpu_generator', '')}")
