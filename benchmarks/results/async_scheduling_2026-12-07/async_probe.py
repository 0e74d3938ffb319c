"""async_scheduling on the GPU: decode steps at B=1/8/32, 4k, fp16, sync and async in turns in one engine (30 steps
each, no sync between steps), then the synchronising calls inside a queued launch (torch's sync debug mode).
Run on the GPU machine from the repository root: `python async_probe.py OUT.json` (H100, 2026-12-07, journal 39b)."""
import json, sys, time, traceback, warnings
import torch
sys.path.insert(0, ".")
from benchmarks.bench_engine import dummy_engine, weight_bytes
from backend.sampling import SamplingParams
from server.dummy_repository import SHAPES

out = sys.argv[1]
budget = min(16 << 30, torch.cuda.mem_get_info()[0] - weight_bytes(SHAPES["qwen3-30b-a3b"]) - (6 << 30))
engine = dummy_engine("qwen3-30b-a3b", "fp16", kv_budget_bytes=budget, max_num_seqs=64)
engine.graphs.capture_all()
rows = []


def setup(B, temperature=0):
    rids = []
    for i in range(B):
        rid = engine.add_request(None, SamplingParams(max_tokens=1000, temperature=temperature, ignore_eos=True),
                                 prompt_ids=[1] * 3996)
        seq = engine.requests[rid]
        engine.cache.allocate(seq.kv, 3995)
        seq.kv.num_tokens = 3995
        rids.append(rid)
    engine.waiting, engine.running = [], [engine.requests[r] for r in rids]
    return rids


def drain():
    engine.args.async_scheduling = False
    engine.step()


for B in (1, 8, 32):
    rids = setup(B)
    for _ in range(5):
        engine.step()
    for arm in ("sync", "async", "sync", "async"):
        engine.args.async_scheduling = arm == "async"
        for _ in range(3):
            engine.step()
        torch.cuda.synchronize()
        queued = 0
        t0 = time.perf_counter()
        for _ in range(30):
            queued += engine.pending is not None
            engine.step()
        torch.cuda.synchronize()
        row = dict(batch=B, arm=arm, step_ms=(time.perf_counter() - t0) / 30 * 1e3, queued=queued,
                   gpu=torch.cuda.get_device_name())
        drain()
        print(json.dumps(row), flush=True)
        rows.append(row)
    for r in rids:
        engine.abort(r)
# which calls synchronise inside a queued launch
rids = setup(8, temperature=0.8)
engine.args.async_scheduling = True
for _ in range(5):
    engine.step()
launch = engine._launch_ahead
sources = []


def watched(step):  # the first synchronising call inside a queued launch raises: its traceback
    torch.cuda.set_sync_debug_mode("error")
    try:
        return launch(step)
    except RuntimeError:
        sources.append(traceback.format_exc()[-3000:])
        raise
    finally:
        torch.cuda.set_sync_debug_mode(0)


engine._launch_ahead = watched
try:
    for _ in range(10):
        engine.step()
except RuntimeError:
    pass
json.dump({"rows": rows, "syncs": list(sources)}, open(out, "w"), indent=1)
print("a sync in a queued launch:", sources[0] if sources else "none")
print("| B | arm | step ms | queued steps of 30 |")
for r in rows:
    print(f"| {r['batch']} | {r['arm']} | {r['step_ms']:.2f} | {r['queued']} |")
