"""Proxy: the alrkvd format applied to keys (values) scaled per channel pair (channel) by a = (w / s2)^(1/4),
w = query energy of the pair (o_proj column energy of the channel), s2 = the key (value) energy: the scale
that minimises the query-weighted key error (output-weighted value error) of a rotated uniform-rate
quantizer. Decoded keys/values are divided by a. Same capture and metric as proxy.py."""
import sys
sys.argv = sys.argv[:1] + ['896']
exec(open('benchmarks/results/alrkvd_tc_2026-11-30/proxy.py').read().split('if __name__')[0])

def pair_energy(x):  # x [T, H, D] -> [H, D/2] energy of each RoPE pair (i, i + D/2), repeated to [H, D]
    e = x.pow(2).mean(0)
    p = e[:, :D // 2] + e[:, D // 2:]
    return torch.cat([p, p], -1)

def weighted(opts, key_w=True, val_w=True, power=0.25):
    base = fmt_coder(opts)
    def c(layer, q, k, v):
        ak = torch.ones(Hkv, D); av = torch.ones(Hkv, D)
        if key_w:
            wq = pair_energy(q).reshape(Hkv, 3, D).mean(1)            # queries of each kv head's group
            ak = (wq / pair_energy(k).clamp_min(1e-12)) ** power
            ak = ak / ak.mean(-1, keepdim=True)
        if val_w:
            W = eng.model.layers[layer].self_attn.o_proj.weight.float()   # [hidden, Hq*D]
            wo = W.pow(2).sum(0).reshape(Hkv, 3, D).sum(1)
            av = (wo / v.pow(2).mean(0).clamp_min(1e-12)) ** power
            av = av / av.mean(-1, keepdim=True)
        kh, vh = base(layer, q, k * ak, v * av)
        return kh / ak, vh / av
    return c

def run2(name, coder):
    """attention error as proxy.run, plus the error after o_proj (what the next layer sees)."""
    tot = ko = 0.0
    layers = range(0, 30, 3)
    for layer in layers:
        q, k, v = rec[layer]
        pos = torch.arange(N + 128).float()
        kh, vh = coder(layer, q[:N], k[:N], v[:N])
        kr, khr = rope(k[:N], pos[:N]), rope(kh, pos[:N])
        qq = q[N:N + 128].transpose(0, 1)
        sd = torch.nn.functional.scaled_dot_product_attention
        W = eng.model.layers[layer].self_attn.o_proj.weight.float()
        out = sd(qq, kr.transpose(0, 1), v[:N].transpose(0, 1), enable_gqa=True)
        outc = sd(qq, khr.transpose(0, 1), vh.transpose(0, 1), enable_gqa=True)
        tot += ((outc - out).norm() / out.norm()).item()
        proj = lambda o: o.transpose(0, 1).reshape(128, -1) @ W.T
        ko += ((proj(outc) - proj(out)).norm() / proj(out).norm()).item()
    n = len(layers)
    print(f"{name:60s} attn_err={tot/n:.4f} oproj_err={ko/n:.4f}", flush=True)

base = dict(latent_bits=4, basis_bits=4, scale_bits=8, rank_budget=8)
for kb, vb, R in [(3, 3, 8), (2, 2, 8), (3, 2, 16)]:
    o = dict(base, k_bits=kb, v_bits=vb, rank_budget=R)
    run2(f"k{kb}v{vb} R{R} plain", fmt_coder(o))
    run2(f"k{kb}v{vb} R{R} keys weighted", weighted(o, True, False))
    run2(f"k{kb}v{vb} R{R} values weighted", weighted(o, False, True))
    run2(f"k{kb}v{vb} R{R} both weighted", weighted(o, True, True))
