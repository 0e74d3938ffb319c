"""One layer's attention of a mixed step (4 decodes at 12k, a 2,044-token chunk after 12,288 cached tokens, ALR-KVD,
one graph): the decode kernel row by row, in tiles of several configs, and the eager path's rebuild + flash SDPA."""
import json, os, sys, time
import torch
import torch.nn.functional as F
sys.path.insert(0, os.getcwd())
import kernels.alrkvd_attention as ka
from backend.kv_cache import SeqKV
from backend.sampling import SamplingParams
from benchmarks.bench_engine import dummy_engine

ctx, chunk, B = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
engine = dummy_engine("qwen3-30b-a3b", "alrkvd-gpu", kv_budget_bytes=8 << 30, max_num_seqs=64,
                      cuda_graph_max_tokens=2048, piecewise_graphs=False)
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
calls = []
orig = cache.decode_kernel
def rec(*a, **k):
    calls.append((a, k)); return orig(*a, **k)
cache.decode_kernel = rec
engine.step()
cache.decode_kernel = orig
print("plan", sorted(n for _, n in engine.plan)[-3:], "calls", len(calls), flush=True)
a, k = calls[-1]
def timed(fn, reps=10):
    fn(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(reps): fn()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps * 1e3
res = {}
rows_k = {kk: v for kk, v in k.items() if kk not in ("tile_starts", "tile_counts")}
res["rows"] = timed(lambda: orig(*a, **rows_k))
base = dict(ka._TILES_STAGE1)
for name, over in [("q8_w8_n64", {}), ("q8_w4_n64", {"num_warps": 4}), ("q8_w8_n32", {"BLOCK_N": 32}),
                   ("q16_w8_n64", {"TILE_Q": 16}), ("q16_w16_n64", {"TILE_Q": 16, "num_warps": 16}),
                   ("q4_w4_n64", {"TILE_Q": 4, "num_warps": 4})]:
    ka._TILES_STAGE1.clear(); ka._TILES_STAGE1.update({**base, **over})
    tq = ka._TILES_STAGE1["TILE_Q"]
    # tiles for this TILE_Q from the step's rows (the same rows as the recorded call)
    from kernels.paged_attention import query_tiles
    qlens = [n for _, n in engine.plan]
    q = a[0]
    pad = q.shape[0] - sum(qlens)
    starts, counts = query_tiles(qlens + ([pad] if pad else []), tq)
    kt = dict(rows_k, tile_starts=torch.tensor(starts, dtype=torch.int32, device="cuda"),
              tile_counts=torch.tensor(counts, dtype=torch.int32, device="cuda"))
    try:
        res[name] = timed(lambda: orig(*a, **kt))
    except Exception as e:
        res[name] = repr(e)[:200]
    print(name, res[name], flush=True)
ka._TILES_STAGE1.clear(); ka._TILES_STAGE1.update(base)
# the eager path: the chunk's closed history rebuilt, then flash attention over it and the chunk
lay = cache.kernel_layers[0]
ids = torch.arange(ctx // cache.block_size, dtype=torch.int32, device="cuda")
qc = torch.randn(1, 32, chunk, 128, dtype=torch.bfloat16, device="cuda")
def eager():
    kk, vv = ka.alrkvd_rebuild_blocks(lay, ids, cache.rotary.cos, cache.rotary.sin, torch.bfloat16)
    kk = torch.cat([kk, kk[:chunk]]).transpose(0, 1)[None]; vv = torch.cat([vv, vv[:chunk]]).transpose(0, 1)[None]
    return F.scaled_dot_product_attention(qc, kk, vv, is_causal=False, enable_gqa=True)
res["rebuild_sdpa"] = timed(eager)
res["rebuild_only"] = timed(lambda: ka.alrkvd_rebuild_blocks(lay, ids, cache.rotary.cos, cache.rotary.sin, torch.bfloat16))
print(json.dumps({"ctx": ctx, "chunk": chunk, "decodes": B, "us_per_layer": res}), flush=True)
open(os.environ["OUT"] + f"/tune_{ctx}_{chunk}.json", "w").write(json.dumps(res))
