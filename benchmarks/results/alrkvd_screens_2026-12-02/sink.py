"""Scratch: the 4.36x preset with a sequence's first n tokens (the attention sink) kept exactly (fp16 keys before
RoPE and values, per sequence: n x 23,040 B, 11.25 n B/token at context 2048). 4k screen.
The sink is held in float16 (store=fp16, the default, as these screens ran) or in the model's dtype (store=model:
float32 on the CPU, what `PagedKVCache(sink_tokens=n)` does; the two differ by 0.35 points on the 4k screen).
Usage: sink.py NAME n=4 [store=fp16|model] [tokens=4096] [alrkvd opt=value ...]"""
import json, os, sys, types
sys.path.insert(0, os.getcwd())  # run from the repository root
import torch
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
from backend.kv_formats import ALRKVDFormat
from backend.evaluate import load_engine, set_cache, load_text_ids, perplexity, DEFAULT_TEXT
name, kv = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
n_sink, tokens = int(kv.pop("n", 4)), int(kv.pop("tokens", 4096))
store = torch.float16 if kv.pop("store", "fp16") == "fp16" else None
opts = dict(block_size=32, k_bits=3, v_bits=3, rank_budget=8, key_weight=8, latent_bits=4, basis_bits=4, scale_bits=8)
opts.update({k: (float(v) if "." in v else int(v)) for k, v in kv.items()})
SINK = {}   # (layer, block id) -> exact (k, v) of the first n tokens, for the block that starts a sequence
orig_encode, orig_decode = ALRKVDFormat.encode, ALRKVDFormat.decode
def encode(self, layer, block_id, k, v, start_pos=None, **kw):
    SINK.pop((layer, int(block_id)), None)
    if start_pos == 0 and n_sink:
        SINK[(layer, int(block_id))] = (k[:n_sink].to(store or k.dtype), v[:n_sink].to(store or v.dtype))
    return orig_encode(self, layer, block_id, k, v, start_pos=start_pos, **kw)
def decode(self, layer, block_ids, *a, **kw):
    k, v = orig_decode(self, layer, block_ids, *a, **kw)
    T = self.block_size
    for i, b in enumerate(self._ids(block_ids, "cpu").tolist()):
        if (layer, b) in SINK:
            sk, sv = SINK[(layer, b)]
            k[i * T:i * T + n_sink], v[i * T:i * T + n_sink] = sk.to(k.dtype), sv.to(v.dtype)
    return k, v
ALRKVDFormat.encode, ALRKVDFormat.decode = encode, decode
args = types.SimpleNamespace(model="default", device="cpu", dtype="auto", chunk=128)
eng = load_engine(args)
ids = load_text_ids(eng, DEFAULT_TEXT, tokens)
set_cache(eng, "alrkvd", opts, 2048)
r = perplexity(eng, ids, 2048, 128)
print(json.dumps(dict(name=name, n_sink=n_sink, store=str(store or "model"), opts=opts, ppl=r["ppl"], tokens=r["tokens"],
                      extra_bytes_per_token=n_sink * 23040 / 2048, windows=[w["ppl"] for w in r["per_window"]])), flush=True)
