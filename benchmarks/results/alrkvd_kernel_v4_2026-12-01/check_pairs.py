import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
from benchmarks import bench_attention as ba
from kernels.testing import check_decode_kernel
import kernels.alrkvd_attention as K
dev = "cuda"; H, G, D = 8, 4, 128
for B, L in [(8, 1024), (1, 4096), (8, 32768)]:
    q = torch.randn(B, H * G, D, device=dev, dtype=torch.float16)
    first, nb = ba.make_alrkvd(B, L, H, D, 128, *ba.VARIANTS["alrkvd-r16"], dev, None)
    cfg = K._stage1_config(q, first["cache"])
    extra = check_decode_kernel(K.alrkvd_decode_attention, K.alrkvd_decode_attention_ref, q, D ** -0.5, **first)[1] if B * L <= 8192 else {}
    layers = [first] + [ba.make_alrkvd(B, L, H, D, 128, *ba.VARIANTS["alrkvd-r16"], dev, None)[0] for _ in range(ba.num_copies(nb, dev) - 1)]
    us = ba.time_calls([lambda kw=kw: K.alrkvd_decode_attention(q, scale=D ** -0.5, **kw) for kw in layers], dev) * 1e6
    print(B, L, "warps", cfg["num_warps"], f"{us:.1f} us", extra, flush=True)
    del layers, first; torch.cuda.empty_cache()
