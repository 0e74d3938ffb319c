"""CPU A/B of the keys' residual-code layout in the PyTorch path the CPU server takes: ALRKVDFormat.decode of 32 blocks
(the served smollm2 preset from model_repository/smollm2/config.pbtxt, 3 kv heads, head_dim 64, random data), codes
token-major (the layout before BENCHMARKS.md section 2s) against head-major, alternated, 2 threads:

    PYTHONPATH=. .venv/bin/python benchmarks/results/alrkvd_ceiling_2026-12-03/cpu_layout.py
"""
import time, torch, json
import backend.kv_formats as kf
opts = json.loads('{"block_size": 64, "k_bits": 4, "v_bits": 4, "rank_budget": 8, "latent_bits": 4, "basis_bits": 4, "scale_bits": 8}')
torch.manual_seed(0)
def bench(order):
    orig = kf.KVFormat._alloc
    def alloc(self, name, shape, dtype, order_=None, **kw):
        if name == "k_resid" and order == "token":
            order_ = None
        return orig(self, name, shape, dtype, order_)
    kf.KVFormat._alloc = lambda self, name, shape, dtype, order=None: alloc(self, name, shape, dtype, order)
    fmt = kf.make_format("alrkvd", 30, 3, 64, torch.float32, "cpu", num_blocks=40, **opts)
    kf.KVFormat._alloc = orig
    print(order, "k_resid strides", fmt.k_resid.stride())
    for b in range(32):
        fmt.encode(0, b, torch.randn(64, 3, 64), torch.randn(64, 3, 64))
    ids = list(range(32))
    for _ in range(3): fmt.decode(0, ids)
    t = time.perf_counter()
    for _ in range(30): fmt.decode(0, ids)
    return (time.perf_counter() - t) / 50 * 1e3
torch.set_num_threads(2)
for rep in range(4):
    for o in ("token", "head"):
        print(o, "%.3f ms per decode of 32 blocks" % bench(o))
