import sys, torch
sys.path.insert(0, ".")
exec(open(".probe/grouped_mm_probe.py").read().split("rows = []")[0])
w13t, w2t = w13.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous()
for T in [2048, 8192]:
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16, generator=g)
    ids = torch.stack([torch.randperm(E, device=dev, generator=g)[:k] for _ in range(T)]).to(torch.int32)
    flat = ids.flatten().long()
    offs = torch.cumsum(torch.bincount(flat, minlength=E), 0, dtype=torch.int32)
    xs = x[torch.argsort(flat, stable=True) // k]
    a2 = torch.randn(T * k, I, device=dev, dtype=torch.bfloat16, generator=g)
    col = graph_us(lambda: (torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs), torch._grouped_mm(a2, w2.transpose(1, 2), offs=offs)))
    row = graph_us(lambda: (torch._grouped_mm(xs, w13t, offs=offs), torch._grouped_mm(a2, w2t, offs=offs)))
    print(f"T={T} GEMMs us: weights [E,N,K] (transposed view) {col:.1f}, [E,K,N] contiguous {row:.1f}", flush=True)
