"""Scratch: per-layer residual bits (sensitive layers at 4 bits, the rest at 2), WikiText-2 4k screen."""
import sys, json, types
sys.path.insert(0, "/work/main")
import torch
torch.set_num_threads(1)
from backend.evaluate import load_engine, set_cache, load_text_ids, perplexity, DEFAULT_TEXT
from backend.kv_formats import make_format
args = types.SimpleNamespace(model="default", device="cpu", dtype="auto", chunk=128)
eng = load_engine(args)
ids = load_text_ids(eng, DEFAULT_TEXT, 4096)
base = dict(block_size=64, rank_budget=8, key_weight=4, latent_bits=4, basis_bits=4, scale_bits=8)
low = dict(base, k_bits=2, v_bits=2)
for spec in sys.argv[1:]:
    hi_bits, layers = spec.split(":")
    kb, vb = map(int, hi_bits.split(","))
    HI = set(int(x) for x in layers.split(",")) if layers else set()
    set_cache(eng, "alrkvd", low, 2048)
    fmt = eng.cache.format
    hopts = dict(base, k_bits=kb, v_bits=vb); bs = hopts.pop("block_size")
    hi = make_format("alrkvd", eng.cfg.num_layers, eng.cfg.num_kv_heads, eng.cfg.head_dim, fmt.dtype, "cpu",
                     num_blocks=fmt.num_blocks, block_size=bs, **hopts)
    enc, dec = fmt.encode, fmt.decode
    fmt.encode = lambda layer, b, k, v, **kw: (hi.encode if layer in HI else enc)(layer, b, k, v, **kw)
    fmt.decode = lambda layer, b, **kw: hi.decode(layer, b) if layer in HI else dec(layer, b)
    r = perplexity(eng, ids, 2048, 128)
    L = eng.cfg.num_layers
    per_layer_low = fmt.bytes_per_block() / L / bs
    per_layer_hi = hi.bytes_per_block() / L / bs
    blocks = per_layer_low * (L - len(HI)) + per_layer_hi * len(HI)
    window = 2 * L * bs * eng.cfg.num_kv_heads * eng.cfg.head_dim * 2 / 2048
    out = dict(spec=spec, ppl=r["ppl"], tokens=r["tokens"], block_bytes_per_token=blocks,
               compression_16bit_window=23040 / (blocks + window))
    print(json.dumps(out), flush=True)
