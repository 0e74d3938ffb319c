"""quant_scaled with bucketize (the code before, `old`) against gauss_codes, on random residuals of 30 blocks with
16-bit and 8-bit log scales: codes and scales equal for 1-8 bits, then the time of each at 4 bits, alternating
(journal 2026-12-05 22b). Run from the repository root: PYTHONPATH=. python <this file>"""
import time, torch, sys
sys.path.insert(0, ".")
from backend.kv_formats import codecs as C
from kernels.codecs import gauss_codebook
def old(x, bits, codebook, scale_round=None, state_bits=None):
    rnd = scale_round or (lambda t: t.to(torch.float16).float())
    rms = x.pow(2).mean(dim=-1, keepdim=True).sqrt().clamp_min(1e-8)
    scales = torch.stack([rnd(rms * f).clamp_min(1e-8) for f in C.SCALE_SEARCH[codebook]])
    y = x / scales
    lv = gauss_codebook(bits).to(x.device)
    q = torch.bucketize(y.contiguous(), (lv[1:] + lv[:-1]) / 2).to(torch.int32)
    err = (C.dequant_scaled(q, scales, bits, codebook, state_bits) - x).pow(2).sum(dim=-1, keepdim=True)
    best = err.argmin(0, keepdim=True)
    return q.gather(0, best.expand_as(q))[0], scales.gather(0, best)[0]
torch.manual_seed(0)
for bits in (1, 2, 3, 4, 5, 8):
    for trial in range(3):
        x = torch.randn(30, 64, 3, 2, 32) * torch.rand(30, 64, 3, 2, 1) ** 3
        x[0, 0, 0, 0, :4] = 0.0
        rms = x.pow(2).mean(-1, keepdim=True).sqrt()
        base = C.log_scale_base(rms.amax(dim=(-4, -2, -1)) * 1.25).view(30, 1, 3, 1, 1)
        for rnd in (None, lambda t: C.log_scale_round(t, base)):
            a, b = old(x, bits, "gauss", rnd), C.quant_scaled(x, bits, "gauss", rnd)
            assert a[0].dtype == b[0].dtype and torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), bits
print("bit for bit equal")
x = torch.randn(30, 64, 3, 1, 64) * torch.rand(30, 64, 3, 1, 1)
rms = x.pow(2).mean(-1, keepdim=True).sqrt()
base = C.log_scale_base(rms.amax(dim=(-4, -2, -1)) * 1.25).view(30, 1, 3, 1, 1)
rnd = lambda t: C.log_scale_round(t, base)
for name, f in (("old", lambda: old(x, 4, "gauss", rnd)), ("new", lambda: C.quant_scaled(x, 4, "gauss", rnd))) * 2:
    f(); t = time.perf_counter()
    for _ in range(30): f()
    print(name, round((time.perf_counter() - t) / 30 * 1e3, 2), "ms")
