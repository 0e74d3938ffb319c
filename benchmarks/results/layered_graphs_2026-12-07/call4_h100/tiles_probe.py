# Ran at f1719f9 (the blocked stage 2, reverted in 67743ae) with .probe/old_paged_attention.py a copy of
# kernels/paged_attention.py at cbf3825 (= main after the revert): `git show cbf3825:kernels/paged_attention.py`.
"""The tiles launch (stage 1 + stage 2) at prefill and decode-row shapes: HEAD before the blocked stage 2 (old), the
tree, and the tree with query tiles of 128 (token, head) rows instead of 64; Qwen3-30B-A3B's heads (32 q, 4 kv)."""
import sys, torch, triton
sys.path.insert(0, ".probe")
import old_paged_attention as old
import kernels.paged_attention as new
torch.manual_seed(0)
dev, dt, Hq, Hkv, D, bs = "cuda", torch.float16, 32, 4, 128, 16
print(torch.cuda.get_device_name())

def case(P, n, seqs):
    """seqs sequences, each n query rows after P cached tokens."""
    L = P + n; nb = L // bs + 1
    kc = torch.randn(nb * seqs, bs, Hkv, D, device=dev, dtype=dt); vc = torch.randn_like(kc)
    tabs = torch.stack([torch.randperm(nb * seqs, device=dev)[:nb] for _ in range(seqs)]).to(torch.int32)
    tables = tabs.repeat_interleave(n, 0).contiguous()
    seq_lens = torch.arange(P + 1, L + 1, device=dev, dtype=torch.int32).repeat(seqs)
    q = torch.randn(n * seqs, Hq, D, device=dev, dtype=dt)
    flops = seqs * 4 * Hq * D * (n * P + n * (n + 1) / 2)
    return kc, vc, tables, seq_lens, q, flops

for P, n, seqs in [(0, 2048, 1), (16384, 2048, 1), (4096, 256, 1), (4096, 1, 32), (32768, 1, 8)]:
    kc, vc, tables, seq_lens, q, flops = case(P, n, seqs)
    line = f"P={P:6} n={n:5} x{seqs:2} |"
    ref = None
    for name, mod, rows in (("old", old, 64), ("new", new, 64), ("new128", new, 128)):
        mod.TILE_ROWS = rows
        starts, counts = mod.query_tiles([n] * seqs, mod.tile_tokens(Hq // Hkv))
        ts = torch.tensor(starts, dtype=torch.int32, device=dev); tc = torch.tensor(counts, dtype=torch.int32, device=dev)
        for bn, w in ((32, None), (64, 8)):
            f = lambda: mod.paged_tiles_attention(q, kc, vc, tables, seq_lens, ts, tc, D ** -0.5, block_n=bn, num_warps=w)
            out = f()
            if ref is None:
                ref = out.float()
            err = (out.float() - ref).abs().max().item()
            us = 1000 * triton.testing.do_bench(f, warmup=5, rep=40)
            line += f" {name} n{bn} w{w} {us:7.1f} us {flops / us / 1e6:4.0f} TF/s e{err:.0e} |"
        mod.TILE_ROWS = 64
    print(line, flush=True)
