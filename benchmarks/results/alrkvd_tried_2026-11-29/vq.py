"""Scratch: vector-quantized residual (k-means codebook of a unit Gaussian in DV dims, 2**(bits*DV) entries)
in place of the scalar Lloyd-Max levels, same storage (the index split into DV codes of `bits`)."""
import sys, json, types
sys.path.insert(0, "/work/main")
import torch
torch.set_num_threads(1)
import backend.kv_formats as kf
from backend.evaluate import load_engine, set_cache, load_text_ids, perplexity, DEFAULT_TEXT

DV = {2: 4, 3: 2}
_CB = {}
def codebook(bits):
    if bits not in _CB:
        dv = DV[bits]; n = 1 << (bits * dv)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(max(200000, 200 * n), dv, generator=g)
        c = x[torch.randperm(x.shape[0], generator=g)[:n]].clone()
        for _ in range(40):
            idx = torch.cdist(x, c).argmin(1)
            s = torch.zeros_like(c).index_add_(0, idx, x)
            cnt = torch.bincount(idx, minlength=n).clamp_min(1)[:, None].float()
            c = s / cnt
        _CB[bits] = c
        mse = (x - c[torch.cdist(x, c).argmin(1)]).pow(2).mean().item()
        print(f"codebook bits={bits} dv={dv} mse/dim {mse:.4f} (scalar Lloyd-Max {kf.ALRKVDFormat.LLOYD_MAX_DISTORTION[bits]})", file=sys.stderr, flush=True)
    return _CB[bits]

orig_q, orig_dq = kf.quant_gauss, kf.dequant_gauss
def quant(x, bits, dim, search=(0.8, 0.9, 1.0, 1.12, 1.25), scale_round=None):
    if bits not in DV: return orig_q(x, bits, dim, search, scale_round)
    dv = DV[bits]; c = codebook(bits).to(x.device)
    rnd = scale_round or (lambda t: t.to(torch.float16).float())
    rms = x.pow(2).mean(dim=-1, keepdim=True).sqrt().clamp_min(1e-8)
    shp = x.shape
    best = None
    for f in search:
        sf = rnd(rms * f).clamp_min(1e-8)
        y = (x / sf).reshape(-1, dv)
        d = (y * y).sum(1, keepdim=True) - 2 * y @ c.t() + (c * c).sum(1)[None]
        idx = d.argmin(1)
        rec = c[idx].reshape(shp) * sf
        err = (rec - x).pow(2).sum(-1, keepdim=True)
        idx = idx.reshape(*shp[:-1], shp[-1] // dv)
        if best is None: best = [err, idx, sf]
        else:
            m = err < best[0]
            best[0] = torch.where(m, err, best[0]); best[2] = torch.where(m, sf, best[2])
            best[1] = torch.where(m, idx, best[1])
    idx = best[1]
    q = torch.stack([(idx >> (bits * i)) & ((1 << bits) - 1) for i in range(dv)], -1).reshape(shp).to(torch.int32)
    return q, best[2]

def dequant(q, scale, bits):
    if bits not in DV: return orig_dq(q, scale, bits)
    dv = DV[bits]; c = codebook(bits).to(q.device)
    shp = q.shape
    qq = q.long().reshape(*shp[:-1], shp[-1] // dv, dv)
    idx = sum(qq[..., i] << (bits * i) for i in range(dv))
    return c[idx].reshape(shp) * scale.float()

kf.quant_gauss, kf.dequant_gauss = quant, dequant
args = types.SimpleNamespace(model="default", device="cpu", dtype="auto", chunk=128)
eng = load_engine(args)
ids = load_text_ids(eng, DEFAULT_TEXT, 4096)
base = dict(block_size=64, rank_budget=8, key_weight=4, latent_bits=4, basis_bits=4, scale_bits=8)
for spec in sys.argv[1:]:
    kb, vb = map(int, spec.split(","))
    set_cache(eng, "alrkvd", dict(base, k_bits=kb, v_bits=vb), 2048)
    r = perplexity(eng, ids, 2048, 128)
    print(json.dumps(dict(spec=spec, ppl=r["ppl"], tokens=r["tokens"])), flush=True)
