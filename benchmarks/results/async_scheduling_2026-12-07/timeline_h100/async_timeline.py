"""async_scheduling's timeline: decode steps at B=1 and B=8 (4k, fp16, CUDA graphs) under torch.profiler, sync then
async, 20 steps each: the GPU's busy time, idle gaps between kernels, the host's waits (synchronize/memcpy calls)."""
import gzip, json, os, sys, time
import torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, ".")
from benchmarks.bench_engine import dummy_engine, weight_bytes
from backend.sampling import SamplingParams
from server.dummy_repository import SHAPES

out = sys.argv[1]
budget = min(16 << 30, torch.cuda.mem_get_info()[0] - weight_bytes(SHAPES["qwen3-30b-a3b"]) - (6 << 30))
engine = dummy_engine("qwen3-30b-a3b", "fp16", kv_budget_bytes=budget, max_num_seqs=64)
engine.graphs.capture_all()


def setup(B):
    rids = []
    for i in range(B):
        rid = engine.add_request(None, SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True),
                                 prompt_ids=[1] * 3996)
        seq = engine.requests[rid]
        engine.cache.allocate(seq.kv, 3995)
        seq.kv.num_tokens = 3995
        rids.append(rid)
    engine.waiting, engine.running = [], [engine.requests[r] for r in rids]
    return rids


def analyse(trace):
    ev = json.load(open(trace))["traceEvents"]
    gpu = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    busy, gaps, (s, t) = 0.0, [], gpu[0]
    for a, b in gpu[1:]:
        if a > t:
            busy += t - s
            gaps.append(a - t)
            s, t = a, b
        else:
            t = max(t, b)
    busy += t - s
    span = gpu[-1][1] - gpu[0][0]
    waits = {}
    for e in ev:
        if e.get("cat") == "cuda_runtime" and ("Synchronize" in e["name"] or "Memcpy" in e["name"]):
            w = waits.setdefault(e["name"], [0, 0.0])
            w[0] += 1
            w[1] += e["dur"]
    big = sorted(gaps, reverse=True)
    bins = {"<2us": (0, 2), "2-5us": (2, 5), "5-20us": (5, 20), "20-50us": (20, 50), ">50us": (50, 1e12)}
    hist = {k: [sum(lo <= g < hi for g in gaps), round(sum(g for g in gaps if lo <= g < hi) / 1e3, 2)]
            for k, (lo, hi) in bins.items()}
    return dict(span_ms=span / 1e3, busy_ms=busy / 1e3, idle_ms=(span - busy) / 1e3,
                gaps_over_50us=sum(g > 50 for g in gaps), idle_in_gaps_over_50us_ms=sum(g for g in gaps if g > 50) / 1e3,
                top_gaps_us=[round(g) for g in big[:12]], gap_hist_count_ms=hist, kernels=len(gpu), host_waits={k: [v[0], round(v[1] / 1e3, 2)] for k, v in waits.items()})


rows = []
for B in (1, 8):
    rids = setup(B)
    for _ in range(5):
        engine.step()
    for arm in ("sync", "async"):
        engine.args.async_scheduling = arm == "async"
        for _ in range(5):
            engine.step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            queued = 0
            for _ in range(20):
                queued += engine.pending is not None
                engine.step()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / 20 * 1e3
        trace = f"{out}/trace_b{B}_{arm}.json"
        prof.export_chrome_trace(trace)
        row = dict(batch=B, arm=arm, wall_step_ms_profiled=wall, queued=queued, **analyse(trace))
        with open(trace, "rb") as f, gzip.open(trace + ".gz", "wb") as g:
            g.write(f.read())
        os.remove(trace)
        print(json.dumps(row), flush=True)
        rows.append(row)
        engine.args.async_scheduling = False
        engine.step()
    for r in rids:
        engine.abort(r)
json.dump(rows, open(f"{out}/timeline.json", "w"), indent=1)
print("| B | arm | wall ms/step | GPU span ms | busy | idle | gaps>50us | idle in them | top gaps us |")
for r in rows:
    print(f"| {r['batch']} | {r['arm']} | {r['wall_step_ms_profiled']:.2f} | {r['span_ms']:.1f} | {r['busy_ms']:.1f} | "
          f"{r['idle_ms']:.1f} | {r['gaps_over_50us']} | {r['idle_in_gaps_over_50us_ms']:.1f} | {r['top_gaps_us'][:6]} |")
for r in rows:
    print(r["batch"], r["arm"], "kernels", r["kernels"], "gaps", r["gap_hist_count_ms"], "waits", r["host_waits"])
