import math, time, torch, sys
sys.path.insert(0, "reports/proto")
from tcq import lut_random, tcq, lm_mse

def train(L, k, iters=12, n=3000, seed=0):
    lut = lut_random(L, seed)
    g = torch.Generator().manual_seed(seed + 1)
    for it in range(iters):
        x = torch.randn(n, 64, generator=g)
        st = tcq(x, lut, k)
        S = lut.numel()
        num = torch.zeros(S).index_add_(0, st.flatten(), x.flatten())
        den = torch.zeros(S).index_add_(0, st.flatten(), torch.ones(x.numel()))
        lut = torch.where(den > 0, num / den.clamp_min(1), lut)
    return lut

torch.manual_seed(123)
xt = torch.randn(2000, 64)
for k, L in ((2, 6), (2, 8), (3, 6), (3, 9), (2, 10)):
    t0 = time.time(); lut = train(L, k); dt = time.time() - t0
    mse = ((lut[tcq(xt, lut, k)] - xt) ** 2).mean().item()
    r = ((lut_random(L)[tcq(xt, lut_random(L), k)] - xt) ** 2).mean().item()
    print(f"k={k} L={L}: LM {lm_mse(xt,k):.5f} random {r:.5f} trained {mse:.5f} gain {10*math.log10(lm_mse(xt,k)/mse):.2f} dB (train {dt:.0f}s)", flush=True)
    torch.save(lut, f"reports/proto/lut_k{k}_L{L}.pt")
