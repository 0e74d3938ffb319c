"""Scratch: ALR-KVD with each block's basis (and ranks) taken from the previous block of the same layer
(the basis a background refresh would have ready), against the block's own basis; 4k WikiText-2 screen."""
import json, os, sys, types
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
import torch
torch.set_num_threads(1)
from backend.evaluate import load_engine, set_cache, load_text_ids, perplexity, DEFAULT_TEXT

args = types.SimpleNamespace(model="default", device="cpu", dtype="auto", chunk=128)
eng = load_engine(args)
ids = load_text_ids(eng, DEFAULT_TEXT, int(sys.argv[2]) if len(sys.argv) > 2 else 4096)  # argv: own|stale [tokens]
opts = dict(block_size=32, k_bits=3, v_bits=3, rank_budget=8, key_weight=8, latent_bits=4, basis_bits=4, scale_bits=8)
mode = sys.argv[1]
set_cache(eng, "alrkvd", opts, 2048)
fmt = eng.cache.format
if mode != "own":
    prev = {}
    orig_qb = fmt.quantized_basis
    def quantized_basis(layer, svals, vh, total):
        out = prev.get(layer)
        prev[layer] = (svals, vh, total)
        if out is None:
            out = (svals, vh, total)
        return orig_qb(layer, *out)
    fmt.quantized_basis = quantized_basis
r = perplexity(eng, ids, 2048, 128)
print(json.dumps({"mode": mode, "ppl": r["ppl"], "tokens": r["tokens"], "windows": [w["ppl"] for w in r["per_window"]]}), flush=True)
