"""H200: device memory the driver takes at the first launch of the rotated ALR-KVD kernel (rank 16), for its
spill stack (local memory for every thread the GPU can hold), at the 4-warp (B=1) and the 2-warp (B=8) launch.

    python benchmarks/results/alrkvd_pipeline_2026-12-03/local_memory.py  (repo root, H200, a fresh process)"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import bench_attention as ba  # noqa: E402
from kernels.alrkvd_attention import alrkvd_decode_attention  # noqa: E402

H, Hq, D, T = ba.NUM_KV_HEADS, ba.NUM_Q_HEADS, ba.HEAD_DIM, ba.ALRKVD_BLOCK
gen = torch.Generator().manual_seed(0)
for B in (1, 8):
    kw, _ = ba.make_alrkvd(B, 4096, H, D, T, *ba.VARIANTS["alrkvd-rot-r16"], "cuda", gen)
    q = torch.randn(B, Hq, D, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    free_before, reserved_before = torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()
    alrkvd_decode_attention(q, scale=D ** -0.5, **kw)  # compiles, then the first launch
    torch.cuda.synchronize()
    taken = free_before - torch.cuda.mem_get_info()[0] - (torch.cuda.memory_reserved() - reserved_before)
    print(f"B={B}: device memory taken by the first launch, beyond torch's allocator: {taken / 2**20:.0f} MiB")
