"""Scratch: ALR-KVD in a per-(layer, kv head) linear frame chosen from calibration statistics, so the
quantization noise lands where the queries (keys) and the output projection (values) weigh it least.
x' = x A before encode, x = x' A^-1 after decode; A = P^(1/2), P = Sigma^-1 # W (matrix geometric mean):
minimizes tr(W P^-1) tr(Sigma P), the metric-weighted error of isotropic noise scaled to the signal.
Usage: metric_frame.py NAME keys=full|diag|off values=full|off [tokens=4096] [reg=1e-3] [alrkvd opt=value ...]"""
import json, os, sys, types
sys.path.insert(0, os.getcwd())  # run from the repository root
import torch
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
from backend.kv_formats import ALRKVDFormat
from backend.evaluate import load_engine, set_cache, load_text_ids, perplexity, DEFAULT_TEXT

name, kv = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
mode_k, mode_v = kv.pop("keys", "full"), kv.pop("values", "full")
tokens, reg = int(kv.pop("tokens", 4096)), float(kv.pop("reg", 1e-3))
opts = dict(block_size=32, k_bits=3, v_bits=3, rank_budget=8, key_weight=8, latent_bits=4, basis_bits=4, scale_bits=8)
opts.update({k: (float(v) if "." in v else int(v)) for k, v in kv.items()})

args = types.SimpleNamespace(model="default", device="cpu", dtype="auto", chunk=128)
eng = load_engine(args)
all_ids = load_text_ids(eng, DEFAULT_TEXT, None)
ids, calib = all_ids[:tokens], all_ids[-2048:]          # calibration: the file's last 2048 tokens
cfg = eng.cfg
H, Hq, D = cfg.num_kv_heads, cfg.num_heads, cfg.head_dim
G = Hq // H

stats, hooks = {}, []
for i, l in enumerate(eng.model.layers):
    def f(mod, inp, out, i=i):
        q, k, v = out.detach().float().split(l.self_attn.qkv_sizes, dim=-1)
        stats.setdefault(i, []).append((q.reshape(-1, Hq, D), k.reshape(-1, H, D), v.reshape(-1, H, D)))
    hooks.append(l.self_attn.qkv_proj.register_forward_hook(f))
eng.reset_cache("fp16", {}, 64 << 20, 1)
eng.score(calib)
for h in hooks:
    h.remove()

def sqrtm(S):
    e, U = torch.linalg.eigh(S)
    return U @ torch.diag(e.clamp_min(0).sqrt()) @ U.T
def frame(Sigma, W):
    """A (symmetric) with A A^T = Sigma^-1 # W, both regularized; scaled to unit mean gain."""
    I = torch.eye(D, dtype=torch.float64)
    Sigma = Sigma + reg * Sigma.trace() / D * I
    W = W + reg * W.trace() / D * I
    Sh = sqrtm(Sigma); Si = torch.linalg.inv(Sh)
    P = Si @ sqrtm(Sh @ W @ Sh) @ Si
    A = sqrtm(P)
    return A / A.diagonal().mean()

Ak = torch.eye(D).repeat(cfg.num_layers, H, 1, 1)
Av = Ak.clone()
for i, l in enumerate(eng.model.layers):
    q, k, v = (torch.cat(t).double() for t in zip(*stats[i]))
    Wo = l.self_attn.o_proj.weight.detach().double()
    for h in range(H):
        qq = q[:, h * G:(h + 1) * G].pow(2).mean((0, 1))
        w = (qq[:D // 2] + qq[D // 2:]) / 2
        Wq = torch.diag(torch.cat([w, w]))          # position-averaged query metric (RoPE pairs isotropic)
        Sk = k[:, h].T @ k[:, h] / k.shape[0]
        if mode_k == "full":
            Ak[i, h] = frame(Sk, Wq).float()
        elif mode_k == "diag":
            Ak[i, h] = frame(torch.diag(Sk.diagonal()), Wq).float()
        M = sum(Wo[:, (h * G + j) * D:(h * G + j + 1) * D].T @ Wo[:, (h * G + j) * D:(h * G + j + 1) * D] for j in range(G))
        Sv = v[:, h].T @ v[:, h] / v.shape[0]
        if mode_v == "full":
            Av[i, h] = frame(Sv, M).float()
        elif mode_v == "diag":
            Av[i, h] = frame(torch.diag(Sv.diagonal()), torch.diag(M.diagonal())).float()
Aki, Avi = torch.linalg.inv(Ak), torch.linalg.inv(Av)

orig_encode, orig_decode = ALRKVDFormat.encode, ALRKVDFormat.decode
def encode(self, layer, block_id, k, v, *a, **kw):
    k2 = torch.einsum("thd,hde->the", k.float(), Ak[layer]).to(k.dtype)
    v2 = torch.einsum("thd,hde->the", v.float(), Av[layer]).to(v.dtype)
    return orig_encode(self, layer, block_id, k2, v2, *a, **kw)
def decode(self, layer, block_ids, *a, **kw):
    k, v = orig_decode(self, layer, block_ids, *a, **kw)
    return (torch.einsum("thd,hde->the", k.float(), Aki[layer]).to(k.dtype),
            torch.einsum("thd,hde->the", v.float(), Avi[layer]).to(v.dtype))
ALRKVDFormat.encode, ALRKVDFormat.decode = encode, decode

set_cache(eng, "alrkvd", opts, 2048)
r = perplexity(eng, ids, 2048, 128)
print(json.dumps(dict(name=name, keys=mode_k, values=mode_v, reg=reg, opts=opts, ppl=r["ppl"], tokens=r["tokens"],
                      windows=[w["ppl"] for w in r["per_window"]])), flush=True)
