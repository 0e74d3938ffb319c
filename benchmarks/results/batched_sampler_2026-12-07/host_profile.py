"""Where a decode step's host time goes on the GPU machine: cProfile of greedy steps at B=32 and B=1 (4k, fp16)."""
import cProfile, io, pstats, sys, time
import torch
sys.path.insert(0, ".")
from benchmarks.bench_engine import dummy_engine, weight_bytes
from backend.sampling import SamplingParams
from server.dummy_repository import SHAPES

budget = min(16 << 30, torch.cuda.mem_get_info()[0] - weight_bytes(SHAPES["qwen3-30b-a3b"]) - (6 << 30))
engine = dummy_engine("qwen3-30b-a3b", "fp16", kv_budget_bytes=budget, max_num_seqs=64)
for B in (32, 1):
    rids = []
    for i in range(B):
        rid = engine.add_request(None, SamplingParams(max_tokens=300, temperature=0, ignore_eos=True),
                                 prompt_ids=[1] * 3996)
        seq = engine.requests[rid]
        engine.cache.allocate(seq.kv, 3995)
        seq.kv.num_tokens = 3995
        rids.append(rid)
    engine.waiting, engine.running = [], [engine.requests[r] for r in rids]
    for _ in range(5):
        engine.step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(30):
        engine.step()
    print(f"B={B} step {(time.perf_counter() - t0) / 30 * 1e3:.2f} ms", flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(30):
        engine.step()
    pr.disable()
    for key in ("tottime", "cumtime"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(28)
        print(f"== B={B} by {key} (30 steps)\n" + s.getvalue(), flush=True)
    for r in rids:
        engine.abort(r)
