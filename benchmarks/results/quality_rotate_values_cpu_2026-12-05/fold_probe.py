"""Issue 36 probe: values rotated by a fixed Hadamard folded into v_proj and o_proj (exact: the model's output is
unchanged), so that a cache with rotate=0 compresses V R, and the decode kernel, which knows nothing of it, reads
rotated values. Keys stay as they are. Usage: fold_probe.py OUT.jsonl [fold|nofold] CONFIG..."""
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import torch
from argparse import Namespace
from backend.evaluate import DEFAULT_TEXT, load_engine, load_text_ids, perplexity, set_cache
from backend.kv_formats.codecs import rotation_matrix
from backend.model import FP16Linear
torch.set_num_threads(1)
out, mode, configs = sys.argv[1], sys.argv[2], sys.argv[3:]
text = os.environ.get("TEXT", DEFAULT_TEXT)
a = Namespace(model="default", device="cpu", dtype="auto", chunk=128)
eng = load_engine(a)
cfg = eng.cfg
D, Hq, Hkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
if mode == "fold":
    R = rotation_matrix(D, int(os.environ.get("SEED", 1234))).double()
    with torch.no_grad():
        for layer in eng.model.layers:
            att = layer.self_attn
            assert not isinstance(att.qkv_proj, FP16Linear), "fold before packing"
            W = att.qkv_proj.weight
            v0 = (Hq + Hkv) * D
            for h in range(Hkv):
                rows = slice(v0 + h * D, v0 + (h + 1) * D)
                W[rows] = (R.t() @ W[rows].double()).to(W.dtype)
                if att.qkv_proj.bias is not None:
                    b = att.qkv_proj.bias
                    b[rows] = (b[rows].double() @ R).to(b.dtype)
            Wo = att.o_proj.weight
            for h in range(Hq):
                cols = slice(h * D, (h + 1) * D)
                Wo[:, cols] = (Wo[:, cols].double() @ R).to(Wo.dtype)
ids = load_text_ids(eng, text, 16384)
for line in configs:
    parts = line.split()
    kv, opts = parts[0], dict(p.split("=", 1) for p in parts[1:])
    t0 = time.time()
    set_cache(eng, kv, opts, 2048)
    res = perplexity(eng, ids, 2048, 128)
    res.update(config=line, fold=mode, text=os.path.basename(text), seconds=round(time.time() - t0, 1))
    with open(out, "a") as f:
        f.write(json.dumps({k: v for k, v in res.items() if k != "per_window"}) + "\n")
    print(f"{mode} {line:70s} ppl {res['ppl']:.4f} comp16 {res['compression_16bit_window']:.2f}x {res['seconds']}s",
          flush=True)
