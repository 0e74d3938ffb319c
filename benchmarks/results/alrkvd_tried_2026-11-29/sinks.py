"""Scratch: keep the first S tokens of each sequence exact (attention sinks), WikiText-2 4k screen."""
import sys, json, types
sys.path.insert(0, "/work/main")
import torch
torch.set_num_threads(1)
from backend.evaluate import load_engine, set_cache, load_text_ids, perplexity, DEFAULT_TEXT
args = types.SimpleNamespace(model="default", device="cpu", dtype="auto", chunk=128)
eng = load_engine(args)
ids = load_text_ids(eng, DEFAULT_TEXT, 4096)
base = dict(block_size=64, rank_budget=8, key_weight=4, latent_bits=4, basis_bits=4, scale_bits=8)
for spec in sys.argv[1:]:
    bits, S = spec.split(":")
    kb, vb = map(int, bits.split(","))
    S = int(S)
    set_cache(eng, "alrkvd", dict(base, k_bits=kb, v_bits=vb), 2048)
    fmt = eng.cache.format
    T = fmt.block_size
    sinks = {}
    enc, dec = fmt.encode, fmt.decode
    def encode(layer, b, k, v, start_pos=0, **kw):
        sinks.pop((layer, int(b)), None)
        if start_pos == 0 and S:
            sinks[(layer, int(b))] = (k[:S].clone(), v[:S].clone())
        enc(layer, b, k, v, start_pos=start_pos, **kw)
    def decode(layer, b, **kw):
        k, v = dec(layer, b)
        b = [int(x) for x in (b.tolist() if torch.is_tensor(b) else b)]
        for i, x in enumerate(b):
            if (layer, x) in sinks:
                k = k.clone(); v = v.clone()
                k[i * T:i * T + S], v[i * T:i * T + S] = sinks[(layer, x)]
        return k, v
    fmt.encode, fmt.decode = encode, decode
    r = perplexity(eng, ids, 2048, 128)
    print(json.dumps(dict(spec=spec, ppl=r["ppl"], tokens=r["tokens"])), flush=True)
