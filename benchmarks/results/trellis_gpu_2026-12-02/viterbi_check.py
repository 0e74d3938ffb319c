"""The Viterbi kernel (kernels/trellis_viterbi.py) on the GPU against the PyTorch reference on the CPU: share of
vectors with identical codes, the largest difference of squared error, and the time of both.
Usage: PYTHONPATH=. python benchmarks/results/trellis_gpu_2026-12-02/viterbi_check.py [vectors=4096]"""
import sys
import time

import torch

from backend import trellis

torch.set_num_threads(1)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
g = torch.Generator().manual_seed(0)
for k, L in trellis.SHIPPED:
    x = torch.randn(N, 64, generator=g)
    t = time.perf_counter()
    ref = trellis.quantize(x, k, L)
    t_cpu = time.perf_counter() - t
    xc = x.cuda()
    trellis.quantize(xc, k, L)                    # compile
    torch.cuda.synchronize()
    t = time.perf_counter()
    got = trellis.quantize(xc, k, L)
    torch.cuda.synchronize()
    t_gpu = time.perf_counter() - t
    got = got.cpu()
    err = lambda c: (trellis.dequantize(c, k, L) - x).pow(2).sum(1)       # noqa: E731
    d = err(got) - err(ref)
    print(f"k={k} L={L}: {N} vectors, identical codes {(got == ref).all(1).float().mean():.4f}, squared error "
          f"kernel - reference: max {d.max():.2e}, mean {d.mean():.2e}; cpu 1 thread {t_cpu * 1e3:.0f} ms, "
          f"gpu {t_gpu * 1e3:.2f} ms")
