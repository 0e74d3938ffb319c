"""Scratch: residual scales as 4-bit log codes (steps of 2^(-1/STEPS)) instead of 8-bit; 4k screen.
Usage: scale4.py NAME [steps=4] [tokens=4096] [alrkvd opt=value ...]"""
import json, os, sys, types
sys.path.insert(0, os.getcwd())  # run from the repository root
import torch
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
import backend.kv_formats as kvf
from backend.evaluate import load_engine, set_cache, load_text_ids, perplexity, DEFAULT_TEXT
name, kv = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
steps, tokens = float(kv.pop("steps", 4)), int(kv.pop("tokens", 4096))
opts = dict(block_size=32, k_bits=3, v_bits=3, rank_budget=8, key_weight=8, latent_bits=4, basis_bits=4, scale_bits=8)
opts.update({k: (float(v) if "." in v else int(v)) for k, v in kv.items()})
kvf.LOG_SCALE_STEPS = steps
def log_scale_code(s, base):
    r = torch.log2(base.float() / s.clamp_min(1e-30))
    return torch.round(r * steps).clamp_(0, 15).to(torch.uint8)
kvf.log_scale_code = log_scale_code
args = types.SimpleNamespace(model="default", device="cpu", dtype="auto", chunk=128)
eng = load_engine(args)
ids = load_text_ids(eng, DEFAULT_TEXT, tokens)
set_cache(eng, "alrkvd", opts, 2048)
r = perplexity(eng, ids, 2048, 128)
print(json.dumps(dict(name=name, steps=steps, opts=opts, ppl=r["ppl"], tokens=r["tokens"],
                      windows=[w["ppl"] for w in r["per_window"]])), flush=True)
