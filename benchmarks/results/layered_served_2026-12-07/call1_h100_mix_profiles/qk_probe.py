"""qk_norm_rope: HEAD's kernel (.probe/norms_old.py, a program per head row) against the tree's, Qwen3-30B-A3B's
heads (32 q, 4 kv, D 128), bf16, us a call from 20 graph-captured calls, T = 1, 8, 256, 2048.
Ran from the repository root with .probe/norms_old.py = `git show 5b86cf9^:kernels/norms.py` (the kernel before):
    mkdir -p .probe && git show 5b86cf9^:kernels/norms.py > .probe/norms_old.py && PYTHONPATH=. python THIS"""
import sys
import torch
sys.path.insert(0, ".probe")
import norms_old
from kernels import norms
from kernels.testing import rope_tables

Hq, Hkv, D = 32, 4, 128
dev = torch.device("cuda")
for T in (1, 8, 256, 2048):
    qkv = torch.randn(T, (Hq + 2 * Hkv) * D, device=dev, dtype=torch.bfloat16)
    w = [1 + torch.randn(D, device=dev, dtype=torch.bfloat16) / 4 for _ in range(2)]
    cos = torch.randn(T, D, device=dev, dtype=torch.bfloat16)
    sin = torch.randn(T, D, device=dev, dtype=torch.bfloat16)
    args = (qkv, Hq, Hkv, D, *w, 1e-6, cos, sin)
    res = {}
    outs = {}
    for name, mod in (("old", norms_old), ("new", norms), ("old2", norms_old), ("new2", norms)):
        outs[name[:3]] = mod.qk_norm_rope(*args)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for _ in range(3):
                mod.qk_norm_rope(*args)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(20):
                mod.qk_norm_rope(*args)
        g.replay(); torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(10):
            g.replay()
        b.record(); torch.cuda.synchronize()
        res[name] = a.elapsed_time(b) / 200 * 1000
    same = all(torch.equal(x, y) for x, y in zip(outs["old"], outs["new"]))
    print(f"T={T:5d} old {res['old']:.1f} / {res['old2']:.1f} us, new {res['new']:.1f} / {res['new2']:.1f} us, "
          f"equal outputs: {same}")
