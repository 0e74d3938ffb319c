"""Scratch: how much a query-aware key frame and an output-aware value frame could gain, in theory: the factor by
which the metric-weighted error of isotropic noise (scaled to the signal) falls in the best linear frame,
(tr W tr S) / (tr (S^1/2 W S^1/2)^1/2)^2, per layer and kv head (W: the position-averaged query energy for keys,
W_o^T W_o of the group's query heads for values; S: the data's second moments on the file's last 2048 tokens)."""
import os, sys, types, torch
sys.path.insert(0, os.getcwd())  # run from the repository root
torch.set_num_threads(2)
from backend.evaluate import load_engine, load_text_ids, DEFAULT_TEXT
args = types.SimpleNamespace(model="default", device="cpu", dtype="float32", chunk=128)
eng = load_engine(args)
ids = load_text_ids(eng, DEFAULT_TEXT, None)
calib = ids[-2048:]   # the end of the test file: disjoint from both eval texts
cfg = eng.cfg
H, Hq, D = cfg.num_kv_heads, cfg.num_heads, cfg.head_dim
G = Hq // H
stats = {}
def hook(layer):
    def f(mod, inp, out):
        q, k, v = out.split(mod_sizes, dim=-1)
        stats.setdefault(layer, []).append((q.reshape(-1, Hq, D).detach(), k.reshape(-1, H, D).detach(), v.reshape(-1, H, D).detach()))
    return f
layers = eng.model.layers
mod_sizes = layers[0].self_attn.qkv_sizes
for i, l in enumerate(layers):
    l.self_attn.qkv_proj.register_forward_hook(hook(i))
# one plain forward of the calibration text through the engine's scorer
eng.reset_cache("fp16", {}, 64 << 20, 1)
eng.score(calib)
gk, gv, gkf = [], [], []
for i in range(cfg.num_layers):
    q, k, v = (torch.cat(t) for t in zip(*stats[i]))
    Wo = layers[i].self_attn.o_proj.weight.detach()   # [hidden, Hq*D]
    for h in range(H):
        qq = q[:, h*G:(h+1)*G].pow(2).mean((0, 1))           # [D]
        w = (qq[:D//2] + qq[D//2:]) / 2; w = torch.cat([w, w])  # RoPE pairs (c, c+D/2) isotropic
        s2 = k[:, h].pow(2).mean(0)
        gk.append((w.sum() * s2.sum() / (w.sqrt() * s2.sqrt()).sum() ** 2).item())
        Sk = (k[:, h].T @ k[:, h] / k.shape[0]).double()
        e, U = torch.linalg.eigh(Sk); Skh = U @ torch.diag(e.clamp_min(0).sqrt()) @ U.T
        inner = torch.linalg.eigvalsh(Skh @ torch.diag(w.double()) @ Skh).clamp_min(0).sqrt().sum()
        gkf.append((w.sum() * torch.trace(Sk) / inner ** 2).item())
        M = sum(Wo[:, (h*G+j)*D:(h*G+j+1)*D].T @ Wo[:, (h*G+j)*D:(h*G+j+1)*D] for j in range(G)).double()
        Sv = (v[:, h].T @ v[:, h] / v.shape[0]).double()
        e, U = torch.linalg.eigh(Sv); Sh = U @ torch.diag(e.clamp_min(0).sqrt()) @ U.T
        inner = torch.linalg.eigvalsh(Sh @ M @ Sh).clamp_min(0).sqrt().sum()
        gv.append((torch.trace(M) * torch.trace(Sv) / inner ** 2).item())
gk, gv = torch.tensor(gk), torch.tensor(gv)
print("key gain (MSE factor): mean %.2f median %.2f min %.2f max %.2f" % (gk.mean(), gk.median(), gk.min(), gk.max()))
gkf = torch.tensor(gkf); print("key gain full: mean %.2f median %.2f" % (gkf.mean(), gkf.median()))
print("value gain: mean %.2f median %.2f min %.2f max %.2f" % (gv.mean(), gv.median(), gv.min(), gv.max()))
print("per layer k:", [round(x, 2) for x in gk.view(-1, H).mean(1).tolist()])
print("per layer v:", [round(x, 2) for x in gv.view(-1, H).mean(1).tolist()])
