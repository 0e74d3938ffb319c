"""Prototype: tail-biting bitshift trellis quantizer (QTIP-style) vs Lloyd-Max on unit Gaussians."""
import math, sys, time, torch
from backend.kv_formats import gauss_codebook

def lut_random(L, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = 1 << L
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    vals = torch.distributions.Normal(0, 1).icdf(u).float()
    return vals[torch.randperm(n, generator=g)]

def viterbi(x, lut, k, prefix=None):
    """x [N, n] -> states [N, n] minimising sum (x - lut[s])^2 over bitshift paths.
    prefix [N] (L-k bits) fixes s_0 >> k and forces s_{n-1} & low == prefix (tail-biting)."""
    N, n = x.shape
    S = lut.numel(); L = int(math.log2(S)); low = 1 << (L - k); hi = 1 << k
    cost = (x[:, 0, None] - lut[None]) ** 2                     # [N, S]
    if prefix is not None:
        ok = (torch.arange(S)[None] >> k) == prefix[:, None]
        cost = torch.where(ok, cost, torch.full_like(cost, float("inf")))
    back = torch.empty(n, N, low, dtype=torch.uint8)
    for t in range(1, n):
        c = cost.view(N, hi, low)                               # s = (high k bits, low L-k bits)
        m, a = c.min(1)                                         # [N, low]
        back[t] = a.to(torch.uint8)
        d = (x[:, t, None] - lut[None]) ** 2                    # [N, S]
        cost = (m[:, :, None] + d.view(N, low, hi)).view(N, S)  # new s = low << k | new bits
    if prefix is not None:
        ok = (torch.arange(S)[None] & (low - 1)) == prefix[:, None]
        cost = torch.where(ok, cost, torch.full_like(cost, float("inf")))
    best, s = cost.min(1)
    states = torch.empty(N, n, dtype=torch.long)
    states[:, -1] = s
    for t in range(n - 1, 0, -1):
        p_low = states[:, t] >> k
        p_high = back[t].long().gather(1, p_low[:, None])[:, 0]
        states[:, t - 1] = (p_high << (L - k)) | p_low
    return states, best

def tcq(x, lut, k):
    S = lut.numel(); L = int(math.log2(S)); low = 1 << (L - k)
    st, _ = viterbi(x, lut, k)
    prefix = st[:, -1] & (low - 1)          # heuristic: the free path's ending bits
    st2, best = viterbi(x, lut, k, prefix)
    return st2

def check_tail(st, k, L):
    n = st.shape[1]; low = (1 << (L - k)) - 1
    assert ((st[:, 1:] >> k) == (st[:, :-1] & low)).all()
    assert ((st[:, 0] >> k) == (st[:, -1] & low)).all()

def lm_mse(x, k):
    lv = gauss_codebook(k); e = (lv[1:] + lv[:-1]) / 2
    return ((lv[torch.bucketize(x, e)] - x) ** 2).mean().item()

if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.randn(2000, 64)
    for k in (2, 3):
        print(f"k={k} LM mse {lm_mse(x, k):.5f}  D(R) {2**(-2*k):.5f}")
        for L in ([6, 8, 10, 12] if k == 2 else [6, 9, 12]):
            lut = lut_random(L)
            t0 = time.time(); st = tcq(x, lut, k); dt = time.time() - t0
            check_tail(st, k, L)
            mse = ((lut[st] - x) ** 2).mean().item()
            print(f"  L={L:2d} tcq mse {mse:.5f} gain {10*math.log10(lm_mse(x,k)/mse):.2f} dB  {dt*1e3/2000*96:.1f} ms per 96 vectors")
