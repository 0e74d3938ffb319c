import sys, pathlib, tempfile, torch
sys.path.insert(0, ".")
import tests.engine.test_cuda_graphs as t

tmp = pathlib.Path(tempfile.mkdtemp())
engine = t.layered_engine(tmp, max_num_batched_tokens=128, kv_format="alrkvd")
real = engine.cache.kernels.decode
diffs = []
def both(q, *args, **kw):
    a = real(q, *args, **kw)
    b = t.alrkvd_rows_ref(q, *args, **kw)
    d = (a.float() - b.float()).abs().amax(dim=(1, 2))  # per row
    diffs.append((q.shape[0], kw.get("tile_starts") is not None, kw.get("closed") is not None, d.max().item(),
                  d.argmax().item()))
    return a
engine.cache.decode_kernel = both
bs = engine.cache.block_size
g = torch.Generator().manual_seed(5)
prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (bs - 4, bs + 3, 2 * bs + 7, bs + 20)]
t.generate_with_arrivals(engine, prompts, bs + 4, arrivals=(2, 4))
print("eager: calls", len(diffs), "max diff", max(d[3] for d in diffs))
n0 = len(diffs)
t.graph_layered_steps(engine)
t.generate_with_arrivals(engine, prompts, bs + 4, arrivals=(2, 4))
big = [d for d in diffs[n0:] if d[3] > 1e-3]
print("graphs: calls", len(diffs) - n0, "max diff", max(d[3] for d in diffs[n0:]), "calls over 1e-3:", len(big))
for d in big[:10]:
    print(d)
