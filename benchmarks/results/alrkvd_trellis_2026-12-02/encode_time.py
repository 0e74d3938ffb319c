"""Time of one ALR-KVD block encode on the CPU, codebook=gauss against codebook=trellis, alternated in one process
(the 4.52x preset: block 32, k3 v3, R=16, 25 of 32 values at 2 bits; real SmolLM2 keys and values of layer 3).
Usage: PYTHONPATH=. python benchmarks/results/alrkvd_trellis_2026-12-02/encode_time.py [threads=1] [device=cpu]"""
import sys
import time

import torch

from backend.kv_formats import make_format

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
dev = sys.argv[2] if len(sys.argv) > 2 else "cpu"
sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
d = torch.load("kernels/testdata/smollm2_kv.pt")
k, v = d["k3"][:32].float().to(dev), d["v3"][:32].float().to(dev)
saliency = torch.rand(32, 3, generator=torch.Generator().manual_seed(0)).to(dev)
preset = dict(block_size=32, k_bits=3, v_bits=3, rank_budget=16, key_weight=16, latent_bits=3, basis_bits=4,
              scale_bits=8, v_low_tokens=25)
fmts = {cb: make_format("alrkvd", 1, 3, 64, torch.float32, dev, num_blocks=1, codebook=cb, **preset)
        for cb in ("gauss", "trellis")}
times = {cb: [] for cb in fmts}
for _ in range(7):
    for cb, f in fmts.items():
        sync()
        t = time.perf_counter()
        f.encode(0, 0, k, v, saliency=saliency)
        sync()
        times[cb].append(time.perf_counter() - t)
med = {cb: sorted(t)[len(t) // 2] * 1e3 for cb, t in times.items()}
print(f"{dev}: ms per block encode, median of 7: gauss {med['gauss']:.1f}, trellis {med['trellis']:.1f} "
      f"({med['trellis'] / med['gauss']:.1f}x)")
