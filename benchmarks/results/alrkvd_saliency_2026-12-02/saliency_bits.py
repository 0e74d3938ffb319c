"""Scratch: ALR-KVD with mixed residual bits per token, chosen by attention saliency (ZipCache-style: the mean
attention a token received from the queries that saw it, over its GQA group). In each block and kv head, the
fraction `fv` of tokens with the least saliency keep `v_lo`-bit value residuals instead of v_bits (likewise
`fk` for keys). `--select random` draws the same fractions at random (control). 4k WikiText-2 screen.
Usage: saliency_bits.py NAME [fv=0.5 v_lo=2 | vt=2:0.5,4:0.25] [fk=.. k_lo=.. | kt=..] [select=random] [tokens=4096]
       [alrkvd option=value ...]"""
import json, math, os, sys, types
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
import torch
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
import backend.kv_cache as kvc
from backend.kv_formats import ALRKVDFormat, make_format
from backend.evaluate import load_engine, set_cache, load_text_ids, perplexity, DEFAULT_TEXT

name, kv = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
# tiers: "bits:fraction,..." from the least salient up (a fraction below the base bits takes the least salient
# tokens, above them the most salient); fk/fv/k_lo/v_lo are the one-tier shorthand
def tiers(spec):
    return [(int(b), float(f)) for b, f in (t.split(":") for t in spec.split(","))] if spec else []
fk, fv = float(kv.pop("fk", 0)), float(kv.pop("fv", 0))
k_lo, v_lo = int(kv.pop("k_lo", 2)), int(kv.pop("v_lo", 2))
K_TIERS = tiers(kv.pop("kt", "")) or ([(k_lo, fk)] if fk else [])
V_TIERS = tiers(kv.pop("vt", "")) or ([(v_lo, fv)] if fv else [])
select, tokens = kv.pop("select", "saliency"), int(kv.pop("tokens", 4096))
opts = dict(block_size=32, k_bits=3, v_bits=3, rank_budget=8, key_weight=8, latent_bits=4, basis_bits=4, scale_bits=8)
opts.update({k: (float(v) if "." in v else int(v)) for k, v in kv.items()})

# --- saliency: the attention each new token receives in its prefill chunk --------------------------------
last = {}
sdpa = torch.nn.functional.scaled_dot_product_attention
def sdpa_probe(q, k, v, attn_mask=None, enable_gqa=False, **kw):
    Hq, Hkv = q.shape[0], k.shape[0]
    kk = k.repeat_interleave(Hq // Hkv, 0)
    s = (q.float() @ kk.float().transpose(-1, -2)) / q.shape[-1] ** 0.5
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    p = s.softmax(-1)                                                    # [Hq, n, P+n]
    seen = attn_mask.sum(0) if attn_mask is not None else torch.ones(p.shape[-1])
    sal = p.sum(1) / seen.clamp_min(1)                                   # normalized: mean over the queries that saw it
    last["sal"] = sal.view(Hkv, Hq // Hkv, -1).mean(1)                   # [Hkv, P+n]
    return sdpa(q, k, v, attn_mask=attn_mask, enable_gqa=enable_gqa, **kw)
kvc.F = types.SimpleNamespace(scaled_dot_product_attention=sdpa_probe)

SAL = {}
orig_write = kvc.PagedKVCache.write
def write(self, layer, seq, k, v):
    if "sal" in last:
        P = seq.num_tokens
        SAL[layer] = (P, last.pop("sal")[:, P:P + k.shape[0]].t())       # [n, Hkv] for positions P..P+n
    orig_write(self, layer, seq, k, v)
kvc.PagedKVCache.write = write

# --- mixed bits: a twin format per bit width; per block and head, which tokens are read from which twin -------
orig_encode, orig_decode = ALRKVDFormat.encode, ALRKVDFormat.decode
gen = torch.Generator().manual_seed(0)
def choose(sal, tier_list, base_bits):
    """[T, H] bit width per token and head: low tiers take the least salient tokens, high tiers the most."""
    T, H = sal.shape
    score = torch.rand(T, H, generator=gen) if select == "random" else sal
    order = score.argsort(0)                                  # ascending saliency
    bits = torch.full((T, H), base_bits, dtype=torch.long)
    lo, hi = 0, T
    for b, f in tier_list:
        n = int(round(f * T))
        rows = order[lo:lo + n] if b < base_bits else order[hi - n:hi]
        if b < base_bits: lo += n
        else: hi -= n
        bits.scatter_(0, rows, b)
    return bits

def encode(self, layer, block_id, k, v, start_pos=None):
    orig_encode(self, layer, block_id, k, v, start_pos=start_pos)
    if not getattr(self, "twins", None):
        return
    for t in self.twins.values():
        orig_encode(t, layer, block_id, k, v, start_pos=start_pos)
    P, sal = SAL[layer]
    s = sal[start_pos - P:start_pos - P + self.block_size]
    assert s.shape[0] == self.block_size, (start_pos, P, sal.shape)
    self.masks[(layer, int(block_id))] = (choose(s, K_TIERS, self.options["k_bits"]), choose(s, V_TIERS, self.options["v_bits"]))

def decode(self, layer, block_ids, start_pos=0):
    k, v = orig_decode(self, layer, block_ids, start_pos=start_pos)
    if not getattr(self, "twins", None):
        return k, v
    ids = self._ids(block_ids, "cpu").tolist()
    if ids:
        mk = torch.cat([self.masks[(layer, b)][0] for b in ids])[..., None]
        mv = torch.cat([self.masks[(layer, b)][1] for b in ids])[..., None]
        for (kb, vb), t in self.twins.items():
            kt, vt = orig_decode(t, layer, block_ids, start_pos=start_pos)
            if kb is not None: k = torch.where(mk == kb, kt, k)
            if vb is not None: v = torch.where(mv == vb, vt, v)
    return k, v
ALRKVDFormat.encode, ALRKVDFormat.decode = encode, decode

args = types.SimpleNamespace(model="default", device="cpu", dtype="auto", chunk=128)
eng = load_engine(args)
ids = load_text_ids(eng, DEFAULT_TEXT, tokens)
set_cache(eng, "alrkvd", opts, 2048)
fmt = eng.cache.format
fmt.twins, fmt.masks = {}, {}
for kb, vb in [(b, None) for b, _ in K_TIERS] + [(None, b) for b, _ in V_TIERS]:
    twin_opts = dict(opts, k_bits=kb or opts["k_bits"], v_bits=vb or opts["v_bits"])
    bs = twin_opts.pop("block_size")
    fmt.twins[(kb, vb)] = make_format("alrkvd", eng.cfg.num_layers, eng.cfg.num_kv_heads, eng.cfg.head_dim, fmt.dtype,
                                      "cpu", num_blocks=fmt.num_blocks, block_size=bs, **twin_opts)
r = perplexity(eng, ids, 2048, 128)
L, H, D, T = eng.cfg.num_layers, eng.cfg.num_kv_heads, eng.cfg.head_dim, fmt.block_size
saved = sum(f * (base - b) for tiers_, base in ((K_TIERS, opts["k_bits"]), (V_TIERS, opts["v_bits"]))
            for b, f in tiers_) * L * H * D / 8                                        # bytes per token
flags = sum(math.log2(len(t) + 1) for t in (K_TIERS, V_TIERS) if t) * L * H / 8       # tier of each token and head

blocks = fmt.bytes_per_block() / T - saved + flags
window = 2 * L * T * H * D * 2 / 2048
print(json.dumps(dict(name=name, k_tiers=K_TIERS, v_tiers=V_TIERS, select=select, opts=opts, ppl=r["ppl"],
                      tokens=r["tokens"], bytes_per_token_16bit_window=blocks + window,
                      compression_16bit_window=23040 / (blocks + window),
                      windows=[w["ppl"] for w in r["per_window"]])), flush=True)
