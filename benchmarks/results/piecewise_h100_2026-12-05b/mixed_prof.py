"""Profile of one piecewise mixed step (run from the repository root on CUDA: `PYTHONPATH=. python benchmarks/results/piecewise_h100_2026-12-05b/mixed_prof.py`; prints profile.txt) (Qwen3-30B-A3B shape, dummy, ALR-KVD): 4 decodes at 4k + a 2,044-token chunk."""
import sys, time, json
import torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, "benchmarks")
from bench_engine import dummy_engine
from backend.sampling import SamplingParams
kvf = sys.argv[1] if len(sys.argv) > 1 else "alrkvd-rotated"
engine = dummy_engine("qwen3-30b-a3b", kvf, kv_budget_bytes=8 << 30, max_num_seqs=64, cuda_graph_max_tokens=2048,
                      piecewise_graphs=True)
cache = engine.cache
def synthetic(prompt_len, cached, max_tokens):
    rid = engine.add_request(None, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
                             prompt_ids=[1] * prompt_len)
    seq = engine.requests[rid]; cache.allocate(seq.kv, cached); seq.kv.num_tokens = cached
    engine.waiting.remove(seq); engine.running.append(seq); return rid
rids = [synthetic(4096, 4095, 40) for _ in range(4)]
def mixed():
    r = synthetic(4096 + 2044, 4096, 1)
    torch.cuda.synchronize(); t = time.perf_counter(); engine.step(); torch.cuda.synchronize()
    engine.abort(r); return (time.perf_counter() - t) * 1e3
for _ in range(3):
    print("warm", round(mixed(), 1))
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    ms = mixed()
ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
gpu = sum(e.device_time for e in ev) / 1e3
print(f"step {ms:.1f} ms; {len(ev)} GPU kernels/copies adding to {gpu:.1f} ms")
ka = prof.key_averages()
print(ka.table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=60))
print(ka.table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))
prof.export_chrome_trace(f"/tmp/mixed_{kvf}.json")
