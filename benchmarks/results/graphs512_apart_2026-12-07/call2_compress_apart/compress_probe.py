"""Where the wall time of a mixed step's compression goes (ALR-KVD, served config): 96 blocks (two prompt blocks in
every layer), as `PagedKVCache.commit` hands them over (views of window slots), through CompressGraphs: each stage's
host time (no sync), and GPU time by CUDA events; medians of 20 calls."""
import json, os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
from benchmarks.bench_step_mix import served_engine
if os.environ.get("OLD_RITZ"):  # the same-run baseline: Cholesky QR twice in every step (HEAD before session 54)
    import backend.kv_formats.alrkvd as fa
    from backend.kv_formats.codecs import _subspace_start, orthonormalize
    def old_ritz(G, k, seed):
        Q = _subspace_start(G.shape[-1], k, seed, G.dtype, G.device).expand(*G.shape[:-2], G.shape[-1], k)
        for _ in range(3):
            Q = orthonormalize(orthonormalize(G @ Q))
        return Q, Q.transpose(-1, -2) @ G @ Q
    fa.subspace_ritz = old_ritz

engine = served_engine("alrkvd-gpu")
engine.graphs.capture_all()
cache = engine.cache
cg = cache.compress_blocks
L = cache.cfg.num_layers
cache.window_k.normal_(); cache.window_v.normal_()
res = {}

def blocks_of(slots):
    return [(layer, 1 + j, 128 * j, cache.window_k[layer, s], cache.window_v[layer, s])
            for j, s in enumerate(slots) for layer in range(L)]

def wall(fn, reps=20):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize(); t = time.perf_counter(); fn(); torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)

def host(fn, reps=20):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize(); t = time.perf_counter(); fn(); ts.append((time.perf_counter() - t) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(ts)

def commit_like():
    cache._filled = blocks_of([0, 1]); cache._compress_filled()

res["total_wall_ms"] = wall(commit_like)
res["views_host_ms"] = host(lambda: blocks_of([0, 1]))
b = blocks_of([0, 1])
def prep():
    layers, ids, starts, ks, vs = zip(*b)
    return list(layers), list(ids), torch.stack(ks), torch.stack(vs), list(starts)
res["stack_host_ms"] = host(prep)
layers, ids, k, v, starts = prep()
n = len(ids); size = next(s for s in cg.sizes if s >= n); pad = size - n
def rows_copy():
    rows = cg.format.storage_rows(layers, ids) + [cg.scratch_row] * pad
    for buf, values in ((cg.rows, rows), (cg.starts, list(starts) + [0] * pad)):
        host_t = torch.tensor(values)
        buf[:size].copy_(host_t.pin_memory(), non_blocking=True)
res["rows_pin_host_ms"] = host(rows_copy)
def kv_copy():
    cg.k[:n].copy_(k); cg.v[:n].copy_(v)
    if pad:
        cg.k[n:size].zero_(); cg.v[n:size].zero_()
res["kv_copy_host_ms"] = host(kv_copy)
res["kv_copy_wall_ms"] = wall(kv_copy)
first, M, last, (w, V), _ = cg.graphs[size]
res["first_replay_wall_ms"] = wall(first.replay)
res["ritz_wall_ms"] = wall(lambda: cg.format.ritz_solve(M))
def eigh_copy():
    for buf, x in zip((w, V), cg.format.ritz_solve(M)):
        buf.copy_(x)
res["last_replay_wall_ms"] = wall(last.replay)
res["call_wall_ms"] = wall(lambda: cg(layers, ids, k, v, starts))
# float32 eigh of the same matrices (precision aside): its time
res["ritz_f32_wall_ms"] = wall(lambda: torch.linalg.eigh(M.float()))
res["M_shape"] = list(M.shape)
res["size"] = size
print(json.dumps(res, indent=1), flush=True)
open(os.environ["OUT"] + f"/compress_probe{os.environ.get('OLD_RITZ', '')}.json", "w").write(json.dumps(res))
