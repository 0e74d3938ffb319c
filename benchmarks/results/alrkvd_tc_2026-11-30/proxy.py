"""Proxy: attention-output error of a weighted transform coder (KLT in a query / output weighted frame,
per-component bits by greedy reverse water-filling, per-token scale) against the alrkvd format.
Real SmolLM2 q/k/v on WikiText-2; tokens [0, N) compressed, queries [N, N+128) attend to them."""
import sys, math, torch
sys.path.insert(0, '.')
from backend.engine import EngineArgs, LLMEngine
from backend.kv_formats import make_format, gauss_codebook
from backend.model import rope_inv_freq
torch.set_num_threads(2)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 896
eng = LLMEngine(EngineArgs(kv_format="fp16", kv_budget_bytes=64 << 20, max_num_seqs=1))
ids = eng.tokenizer.encode(open('data/wikitext-2-raw/wiki.test.raw').read(40000), add_special_tokens=False)[:N + 128]
rec = {}
orig = eng.cache.attend
def attend(layer, q, k, *rest):
    rec[layer] = (q.float().clone(), k.float().clone(), rest[-2].float().clone()); return orig(layer, q, k, *rest)
eng.cache.attend = attend; eng.score(ids, chunk_size=N + 128); eng.cache.attend = orig
rot = eng.model.rotary
cfg = eng.model.cfg if hasattr(eng.model, 'cfg') else eng.cfg
inv_freq = rope_inv_freq(cfg).float()
Hq, Hkv, D = 9, 3, 64
DIST = [1.0, 0.3634, 0.1175, 0.03454, 0.009497, 0.002499, 0.000642, 0.000163, 0.0000411]

def rope(x, pos):  # x [T, H, D], pos [T] float (may be negative)
    f = pos[:, None] * inv_freq[None]; emb = torch.cat([f, f], -1)
    c, s = emb.cos()[:, None], emb.sin()[:, None]
    x2 = torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)
    return x * c + x2 * s

def allocate(lam, total_bits, bmax=8):
    b = torch.zeros(len(lam), dtype=torch.long)
    for _ in range(total_bits):
        gain = torch.tensor([lam[i] * (DIST[b[i]] - DIST[b[i] + 1]) if b[i] < bmax else -1 for i in range(len(lam))])
        b[int(gain.argmax())] += 1
    return b

def lm_quant(x, bits):  # x normalized, returns dequantized
    if bits == 0: return torch.zeros_like(x)
    lv = gauss_codebook(bits)
    idx = torch.bucketize(x, (lv[1:] + lv[:-1]) / 2)
    return lv[idx]

def wklt(X, M, avg_bits, fit=None, token_scale=True):
    """X [N, D] one stream; M [D, D] weight; returns reconstruction. fit: the rows the basis is fitted on."""
    e, U = torch.linalg.eigh(M.double()); e = e.clamp_min(e.max() * 1e-6)
    A = (U * e.sqrt()) @ U.T; Ainv = (U / e.sqrt()) @ U.T
    Y = X.double() @ A
    F = Y if fit is None else Y[fit]
    mu = F.mean(0)
    lam, V = torch.linalg.eigh((F - mu).T @ (F - mu) / len(F))
    lam, V = lam.flip(0).clamp_min(1e-12), V.flip(1)
    Z = (Y - mu) @ V / lam.sqrt()          # unit variance components
    b = allocate(lam.tolist(), int(round(avg_bits * D)))
    on = b > 0
    s = Z[:, on].pow(2).mean(1, keepdim=True).sqrt() if token_scale else torch.ones(len(Z), 1, dtype=Z.dtype)
    s = torch.exp2(torch.round(torch.log2(s.clamp_min(1e-6)) * 16) / 16)  # 8-bit log scale
    Zh = torch.zeros_like(Z)
    for bits in b.unique().tolist():
        sel = b == bits
        Zh[:, sel] = lm_quant((Z[:, sel] / s).float(), bits).double() * s
    # fp16/int8 basis rounding ignored here (store V^T Ainv in 8 bits: small)
    return ((Zh * lam.sqrt()) @ V.T + mu) @ Ainv

def run(name, coder):
    tot = ke = ve = 0.0
    layers = range(0, 30, 3)
    for layer in layers:
        q, k, v = rec[layer]
        pos = torch.arange(N + 128).float()
        kh, vh = coder(layer, q[:N], k[:N], v[:N])
        kr, khr = rope(k[:N], pos[:N]), rope(kh, pos[:N])
        qq = q[N:N + 128].transpose(0, 1)
        sd = torch.nn.functional.scaled_dot_product_attention
        out = sd(qq, kr.transpose(0, 1), v[:N].transpose(0, 1), enable_gqa=True)
        outc = sd(qq, khr.transpose(0, 1), vh.transpose(0, 1), enable_gqa=True)
        outk = sd(qq, khr.transpose(0, 1), v[:N].transpose(0, 1), enable_gqa=True)
        outv = sd(qq, kr.transpose(0, 1), vh.transpose(0, 1), enable_gqa=True)
        r = lambda o: ((o - out).norm() / out.norm()).item()
        tot += r(outc); ke += r(outk); ve += r(outv)
    n = len(layers)
    print(f"{name:60s} attn_err={tot/n:.4f} k_only={ke/n:.4f} v_only={ve/n:.4f}", flush=True)

def fmt_coder(opts):
    def c(layer, q, k, v):
        o = dict(opts); bs = int(o.pop("block_size", 64))
        fmt = make_format("alrkvd", 30, 3, 64, torch.float32, "cpu", 64, bs, **o)
        nb = N // bs
        for b in range(nb):
            sl = slice(b * bs, (b + 1) * bs); fmt.encode(layer, b, k[sl], v[sl])
        return fmt.decode(layer, list(range(nb)))
    return c

def key_weight_matrix(q, h, samples=8):
    """E over queries of the group and relative distances of (R_delta q_pre)(R_delta q_pre)^T."""
    T = len(q); pos = torch.arange(T).float()
    qpre = rope(q, -pos)[:, h * 3:(h + 1) * 3]               # [T, 3, D] before RoPE
    acc = torch.zeros(D, D, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    for _ in range(samples):
        delta = (torch.rand(T, generator=g) * (pos + 1)).floor()
        qr = rope(qpre, delta).reshape(-1, D).double()
        acc += qr.T @ qr
    return acc / (samples * T * 3)

def value_weight_matrix(layer, h):
    W = eng.model.layers[layer].self_attn.o_proj.weight.float()
    cols = torch.cat([W[:, (h * 3 + j) * D:(h * 3 + j + 1) * D] for j in range(3)], 0)  # [3*hidden, D]
    return (cols.T @ cols).double()

def tc_coder(kb, vb, kweight="query", vweight="oproj", token_scale=True):
    def c(layer, q, k, v):
        kh, vh = torch.empty_like(k), torch.empty_like(v)
        for h in range(Hkv):
            Mk = key_weight_matrix(q, h) if kweight == "query" else torch.eye(D, dtype=torch.float64)
            Mv = value_weight_matrix(layer, h) if vweight == "oproj" else torch.eye(D, dtype=torch.float64)
            kh[:, h] = wklt(k[:, h], Mk, kb, token_scale=token_scale).float()
            vh[:, h] = wklt(v[:, h], Mv, vb, token_scale=token_scale).float()
        return kh, vh
    return c

if __name__ == "__main__":
    base = dict(latent_bits=4, basis_bits=4, scale_bits=8, rank_budget=8)
    run("alrkvd b64 k4v4 R8 (3.32x)", fmt_coder(dict(base, k_bits=4, v_bits=4)))
    run("alrkvd b64 k3v3 R8 (4.19x)", fmt_coder(dict(base, k_bits=3, v_bits=3)))
    run("alrkvd b64 k3v2 R16 (4.57x)", fmt_coder(dict(base, k_bits=3, v_bits=2, rank_budget=16)))
    run("alrkvd b64 k2v2 R8 (5.68x)", fmt_coder(dict(base, k_bits=2, v_bits=2)))
    for kb, vb in [(3, 3), (2.5, 2.5), (2, 2)]:
        run(f"tc k{kb} v{vb} query/oproj", tc_coder(kb, vb))
        run(f"tc k{kb} v{vb} identity/identity", tc_coder(kb, vb, "eye", "eye"))
        run(f"tc k{kb} v{vb} query/identity", tc_coder(kb, vb, "query", "eye"))
