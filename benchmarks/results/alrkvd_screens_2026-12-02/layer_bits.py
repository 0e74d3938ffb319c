"""Scratch: the 4.36x preset with some layers at other key/value bits (a twin format serves those layers).
Usage: layer_bits.py NAME layers=0,1 k=4 v=4 [tokens=4096] [alrkvd opt=value ...]"""
import json, os, sys, types
sys.path.insert(0, os.getcwd())  # run from the repository root
import torch
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
from backend.kv_formats import ALRKVDFormat, make_format
from backend.evaluate import load_engine, set_cache, load_text_ids, perplexity, DEFAULT_TEXT

name, kv = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
layers = {int(x) for x in kv.pop("layers").split(",") if x}
kb, vb = int(kv.pop("k", 4)), int(kv.pop("v", 4))
tokens = int(kv.pop("tokens", 4096))
opts = dict(block_size=32, k_bits=3, v_bits=3, rank_budget=8, key_weight=8, latent_bits=4, basis_bits=4, scale_bits=8)
opts.update({k: (float(v) if "." in v else int(v)) for k, v in kv.items()})

orig_encode, orig_decode = ALRKVDFormat.encode, ALRKVDFormat.decode
def encode(self, layer, block_id, k, v, *a, **kw):
    f = self.twin if layer in layers and hasattr(self, "twin") else self
    return orig_encode(f, layer, block_id, k, v, *a, **kw)
def decode(self, layer, block_ids, *a, **kw):
    f = self.twin if layer in layers and hasattr(self, "twin") else self
    return orig_decode(f, layer, block_ids, *a, **kw)
ALRKVDFormat.encode, ALRKVDFormat.decode = encode, decode

args = types.SimpleNamespace(model="default", device="cpu", dtype="auto", chunk=128)
eng = load_engine(args)
ids = load_text_ids(eng, DEFAULT_TEXT, tokens)
set_cache(eng, "alrkvd", opts, 2048)
fmt = eng.cache.format
t_opts = dict(opts, k_bits=kb, v_bits=vb); bs = t_opts.pop("block_size")
fmt.twin = make_format("alrkvd", eng.cfg.num_layers, eng.cfg.num_kv_heads, eng.cfg.head_dim, fmt.dtype, "cpu",
                       num_blocks=fmt.num_blocks, block_size=bs, **t_opts)
r = perplexity(eng, ids, 2048, 128)
L, H, D = eng.cfg.num_layers, eng.cfg.num_kv_heads, eng.cfg.head_dim
extra = len(layers) * H * D * ((kb - opts["k_bits"]) + (vb - opts["v_bits"])) / 8      # bytes per token
base = fmt.bytes_per_block() / bs + 2 * L * bs * H * D * 2 / 2048
print(json.dumps(dict(name=name, layers=sorted(layers), k=kb, v=vb, opts=opts, ppl=r["ppl"], tokens=r["tokens"],
                      bytes_per_token_16bit_window=base + extra, compression=23040 / (base + extra),
                      windows=[w["ppl"] for w in r["per_window"]])), flush=True)
