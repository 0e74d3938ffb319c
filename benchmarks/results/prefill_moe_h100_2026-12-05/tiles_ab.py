"""Tiles kernel before (HEAD, .probe/base) and after (tree) at prefill shapes; FA2 lower-right for reference."""
import sys, importlib.util, torch, triton, torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
sys.path.insert(0, ".")
import kernels.paged_attention as new
spec = importlib.util.spec_from_file_location("base_pa", ".probe/base/kernels/paged_attention.py")
base = importlib.util.module_from_spec(spec); spec.loader.exec_module(base)
torch.manual_seed(0)
dev, dt, Hq, Hkv, D, bs = "cuda", torch.bfloat16, 32, 4, 128, 16
print(torch.cuda.get_device_name())
for P, n in [(0, 2048), (16384, 2048), (30720, 2048), (4096, 248), (4096, 8)]:
    L = P + n; nb = L // bs + 1
    kc = torch.randn(nb, bs, Hkv, D, device=dev, dtype=dt); vc = torch.randn_like(kc)
    perm = torch.randperm(nb, device=dev).to(torch.int32)
    q = torch.randn(n, Hq, D, device=dev, dtype=dt)
    tables = perm[None].expand(n, nb).contiguous()
    seq_lens = torch.arange(P + 1, L + 1, device=dev, dtype=torch.int32)
    flops = 4 * Hq * D * (n * P + n * (n + 1) / 2)
    starts, counts = new.query_tiles([n], Hq // Hkv)
    ts = torch.tensor(starts, dtype=torch.int32, device=dev); tc = torch.tensor(counts, dtype=torch.int32, device=dev)
    res = {}
    for name, mod in (("base", base), ("new", new), ("base", base), ("new", new)):
        for bn, w in ((32, None), (64, None), (64, 8)):
            f = lambda: mod.paged_tiles_attention(q, kc, vc, tables, seq_lens, ts, tc, D ** -0.5, block_n=bn, num_warps=w)
            out = f(); ms = triton.testing.do_bench(f, warmup=5, rep=40)
            res.setdefault(f"{name} n{bn} w{w}", []).append(ms)
    ref = base.paged_tiles_attention(q, kc, vc, tables, seq_lens, ts, tc, D ** -0.5)
    err = (new.paged_tiles_attention(q, kc, vc, tables, seq_lens, ts, tc, D ** -0.5).float() - ref.float()).abs().max().item()
    line = f"P={P:6} n={n:5} err {err:.1e} |"
    for k, v in res.items():
        ms = min(v); line += f" {k} {ms:.3f} ms {flops / ms / 1e9:4.0f} TF/s |"
    print(line)
