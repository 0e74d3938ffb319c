"""One layer's attention in the served mix's mixed step at 32 users (31 decodes after ~225 tokens, a 225-token chunk
after 226 cached): ALR-KVD's decode kernel in tiles under launch variants, against fp16's tiles kernel; and the
decode-only step's launch of each. CUDA events, 20 launches, the graph's own arguments (recorded from the step)."""
import gc, json, os, sys
import torch
sys.path.insert(0, os.getcwd())
import kernels.alrkvd_attention as ka
from backend.sampling import SamplingParams
from benchmarks.bench_step_mix import served_engine

ctx, chunk, B = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
res = {}

def timed(fn, reps=20):
    """GPU time of one call: captured in a CUDA graph (the host's launch cost out), replayed `reps` times."""
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(reps): g.replay()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps * 1e3

def setup(fmt):
    engine = served_engine(fmt)
    cache = engine.cache
    def synthetic(prompt_len, cached, max_tokens):
        rid = engine.add_request(None, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
                                 prompt_ids=[1] * prompt_len)
        seq = engine.requests[rid]
        cache.allocate(seq.kv, cached); seq.kv.num_tokens = cached
        engine.waiting.remove(seq); engine.running.append(seq)
    for _ in range(B):
        synthetic(ctx, ctx - 1, 50)
    synthetic(ctx + chunk, ctx, 1)
    return engine, cache

def record(cache, name):
    calls, orig = [], getattr(cache, name)
    def rec(*a, **k):
        calls.append((a, k)); return orig(*a, **k)
    setattr(cache, name, rec)
    return calls, orig

# ALR-KVD
engine, cache = setup("alrkvd-gpu")
calls, orig = record(cache, "decode_kernel")
engine.step()
mixed = calls[-1]
print("alrkvd mixed call: rows", mixed[0][0].shape, "kwargs", sorted(mixed[1]), "plan", len(engine.plan), flush=True)
base = dict(ka._TILES_STAGE1)
for name, over in [("default", {}), ("split512", {"MIN_TOKENS_PER_SPLIT": 512}),
                   ("split1024", {"MIN_TOKENS_PER_SPLIT": 1024}), ("split2048", {"MIN_TOKENS_PER_SPLIT": 2048}), ("split4096", {"MIN_TOKENS_PER_SPLIT": 4096}),
                   ("split8192", {"MIN_TOKENS_PER_SPLIT": 8192}),
                   ("w2", {"num_warps": 2}), ("w8", {"num_warps": 8}), ("win128", {"WINDOW_N": 128}),
                   ("win32", {"WINDOW_N": 32}), ("split1024_win128", {"MIN_TOKENS_PER_SPLIT": 1024, "WINDOW_N": 128})]:
    ka._TILES_STAGE1.clear(); ka._TILES_STAGE1.update({**base, **over})
    try:
        res["alrkvd_tiles_" + name] = timed(lambda: orig(*mixed[0], **mixed[1]))
    except Exception as e:
        res["alrkvd_tiles_" + name] = repr(e)[:300]
    print(name, res["alrkvd_tiles_" + name], flush=True)
ka._TILES_STAGE1.clear(); ka._TILES_STAGE1.update(base)
calls.clear()
engine.step()
dec = calls[-1]
print("alrkvd decode call: rows", dec[0][0].shape, sorted(dec[1]), flush=True)
cache.decode_kernel = orig
res["alrkvd_decode_step"] = timed(lambda: orig(*dec[0], **dec[1]))
del engine, cache, calls, mixed, dec, orig
gc.collect(); torch.cuda.empty_cache()

# fp16
engine, cache = setup("fp16")
tcalls, torig = record(cache, "tiles_kernel")
dcalls, dorig = record(cache, "decode_kernel")
engine.step()
mixed = tcalls[-1]
print("fp16 mixed call: rows", mixed[0][0].shape, flush=True)
res["fp16_tiles"] = timed(lambda: torig(*mixed[0], **mixed[1]))
engine.step()
dec = dcalls[-1]
res["fp16_decode_step"] = timed(lambda: dorig(*dec[0], **dec[1]))
print(json.dumps({"ctx": ctx, "chunk": chunk, "decodes": B, "us_per_layer": res}, indent=1), flush=True)
open(os.environ["OUT"] + f"/mixed_tiles_{ctx}_{chunk}_{B}.json", "w").write(json.dumps(res))
