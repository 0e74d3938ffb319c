"""Scratch: residual codes by a tail-biting bitshift trellis (trained LUT) instead of scalar Lloyd-Max; 4k screen.
Usage: tcq_screen.py NAME [tokens=4096] [off=1 (plain preset)] [alrkvd opt=value ...]"""
import json, os, sys, types, time
sys.path.insert(0, os.getcwd()); sys.path.insert(0, "reports/proto")
import torch
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
import backend.kv_formats as kvf
from backend.evaluate import load_engine, set_cache, load_text_ids, perplexity, DEFAULT_TEXT
from tcq import tcq
name, kv = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
tokens, off = int(kv.pop("tokens", 4096)), int(kv.pop("off", 0))
Ls = {3: int(kv.pop("L3", 9)), 2: int(kv.pop("L2", 8))}
opts = dict(block_size=32, k_bits=3, v_bits=3, rank_budget=8, key_weight=8, latent_bits=4, basis_bits=4, scale_bits=8)
opts.update({k: (float(v) if "." in v else int(v)) for k, v in kv.items()})
LUT = {k: torch.load(f"reports/proto/lut_k{k}_L{L}.pt") for k, L in Ls.items()}

def quant_tcq(x, bits, dim=-1, search=None, scale_round=None):
    rnd = scale_round or (lambda t: t.to(torch.float16).float())
    rms = x.pow(2).mean(dim=-1, keepdim=True).sqrt().clamp_min(1e-8)
    s = rnd(rms).clamp_min(1e-8)
    y = (x / s).reshape(-1, x.shape[-1])
    st = tcq(y, LUT[bits], bits)
    return (st & ((1 << bits) - 1)).to(torch.int32).reshape(x.shape), s

def states_of(q, bits):
    L = Ls[bits]; m = L // bits
    q = q.long()
    return sum(torch.roll(q, j, dims=-1) << (j * bits) for j in range(m))

def dequant_tcq(q, scale, bits):
    return LUT[bits][states_of(q, bits)] * scale.float()

if not off:
    kvf.quant_gauss, kvf.dequant_gauss = quant_tcq, dequant_tcq
args = types.SimpleNamespace(model="default", device="cpu", dtype="auto", chunk=128)
eng = load_engine(args)
ids = load_text_ids(eng, DEFAULT_TEXT, tokens)
set_cache(eng, "alrkvd", opts, 2048)
t0 = time.time()
r = perplexity(eng, ids, 2048, 128)
print(json.dumps(dict(name=name, off=off, Ls=Ls, opts=opts, ppl=r["ppl"], tokens=r["tokens"], secs=time.time() - t0,
                      windows=[w["ppl"] for w in r["per_window"]])), flush=True)
