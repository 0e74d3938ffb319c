"""B=1 L=4k: is the window split the long pole? Same closed blocks, window of 128 vs 1 token."""
import sys, json
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
from benchmarks import bench_attention as ba
import kernels.alrkvd_attention as new
dev = "cuda"; H, G, D = 8, 4, 128
q = torch.randn(1, 32, D, device=dev, dtype=torch.float16)
data = [(q[:, :, None], torch.randn(1, H, 4096, D, device=dev, dtype=torch.float16), torch.randn(1, H, 4096, D, device=dev, dtype=torch.float16)) for _ in range(8)]
print("sdpa 4096", ba.time_calls([ba.sdpa_call(*x) for x in data], dev) * 1e6)
first, nb = ba.make_alrkvd(1, 4096, H, D, 128, *ba.VARIANTS["alrkvd-r16"], dev, None)
layers = [first] + [ba.make_alrkvd(1, 4096, H, D, 128, *ba.VARIANTS["alrkvd-r16"], dev, None)[0] for _ in range(15)]
for seq in (4096, 4033, 3969, 3968):
    ls = [dict(kw, seq_lens=torch.full((1,), seq, dtype=torch.int32, device=dev)) for kw in layers]
    for ns in (None, 16, 31, 62):
        us = ba.time_calls([lambda kw=kw: new.alrkvd_decode_attention(q, scale=D ** -0.5, num_splits=ns, **kw) for kw in ls], dev) * 1e6
        print(f"seq_len {seq} (closed {(seq - 1) // 128}, window {seq - (seq - 1) // 128 * 128}) splits {ns}: {us:.1f} us", flush=True)
