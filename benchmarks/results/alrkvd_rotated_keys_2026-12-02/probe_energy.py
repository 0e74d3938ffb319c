"""Energy left to the residual by a rank-r basis per 128-token block, keys before and after RoPE (real SmolLM2 keys of
kernels/testdata/smollm2_kv.pt, positions from 2000). From the repository root:
    .venv/bin/python benchmarks/results/alrkvd_rotated_keys_2026-12-02/probe_energy.py
Printed on CPU, 2026-12-02 (BENCHMARKS.md section 2h): layer 3 r16 0.0656 before / 0.1284 after; layer 20 0.0300 / 0.0517."""
import torch
d = torch.load("kernels/testdata/smollm2_kv.pt")
D = d["head_dim"]; theta = d["rope_theta"]
inv = 1.0 / theta ** (torch.arange(0, D, 2).float() / D)
def rope(x, pos):
    f = torch.outer(pos.float(), inv); emb = torch.cat([f, f], -1)
    c, s = emb.cos()[:, None], emb.sin()[:, None]
    h = D // 2
    rh = torch.cat([-x[..., h:], x[..., :h]], -1)
    return x * c + rh * s
T = 128
for layer in d["layers"]:
    k = d[f"k{layer}"].float()
    N = k.shape[0]
    kp = rope(k, torch.arange(N) + 2000)   # positions further out
    for name, x in (("pre", k), ("post", kp)):
        res = []
        for r in (8, 16, 24, 32):
            errs = []
            for b in range(N // T):
                X = x[b*T:(b+1)*T].permute(1, 0, 2)  # H, T, D
                S = torch.linalg.svdvals(X)
                e = S.pow(2)
                errs.append((e[:, r:].sum(-1) / e.sum(-1)))
            res.append(f"r{r}: {torch.stack(errs).mean():.4f}")
        print(layer, name, " ".join(res))
