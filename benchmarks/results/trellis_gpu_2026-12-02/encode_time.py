"""Time of one ALR-KVD block encode, codebook=gauss against codebook=trellis with 8/9 and with 12 state bits,
alternated in one process (the 4.52x preset: block 32, k3 v3, R=16, 25 of 32 values at 2 bits; real SmolLM2 keys
and values of layer 3). On CUDA the trellis codes come from the Viterbi kernel (kernels/trellis_viterbi.py).
Usage: PYTHONPATH=. python benchmarks/results/trellis_gpu_2026-12-02/encode_time.py [threads=1] [device=cpu] [repeats=7]"""
import sys
import time

import torch

from backend.kv_formats import make_format

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
dev = sys.argv[2] if len(sys.argv) > 2 else "cpu"
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 7
sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
d = torch.load("kernels/testdata/smollm2_kv.pt")
k, v = d["k3"][:32].float().to(dev), d["v3"][:32].float().to(dev)
saliency = torch.rand(32, 3, generator=torch.Generator().manual_seed(0)).to(dev)
preset = dict(block_size=32, k_bits=3, v_bits=3, rank_budget=16, key_weight=16, latent_bits=3, basis_bits=4,
              scale_bits=8, v_low_tokens=25)
variants = {"gauss": {"codebook": "gauss"}, "trellis": {"codebook": "trellis"},
            "trellis L12": {"codebook": "trellis", "trellis_state_bits": 12}}
fmts = {name: make_format("alrkvd", 1, 3, 64, torch.float32, dev, num_blocks=1, **preset, **o)
        for name, o in variants.items()}
times = {name: [] for name in fmts}
for f in fmts.values():                                  # warm-up (kernel compilation)
    f.encode(0, 0, k, v, saliency=saliency)
for _ in range(repeats):
    for name, f in fmts.items():
        sync()
        t = time.perf_counter()
        f.encode(0, 0, k, v, saliency=saliency)
        sync()
        times[name].append(time.perf_counter() - t)
med = {name: sorted(t)[len(t) // 2] * 1e3 for name, t in times.items()}
print(f"{dev}: ms per block encode, median of {repeats}: " + ", ".join(
    f"{name} {m:.1f} ({m / med['gauss']:.1f}x)" for name, m in med.items()))
