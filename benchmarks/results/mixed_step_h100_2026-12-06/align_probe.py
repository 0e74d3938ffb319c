"""The MoE alignment at a step's pair counts (Qwen3: 128 experts, top 8; M tile as block_size_m gives): one program
(`_moe_align_kernel`), programs of CHUNK_PAIRS (count + place, with the padding fill), the PyTorch sort; us a call
from CUDA-graph replays (bench_attention.time_calls), 16 calls over their own ids."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_attention import time_calls  # noqa: E402
from kernels import fused_moe as fm  # noqa: E402

E, K = 128, 8
dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
print(f"{'tokens':>6} {'pairs':>6} {'M tile':>6} {'one program':>12} {'programs':>9} {'sort':>8}   (us a call)")
for T in (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 8192):
    ids = [torch.stack([torch.randperm(E, device=dev, generator=g)[:K] for _ in range(T)]).int() for _ in range(16)]
    block = fm.block_size_m(T * K, E)
    row = []
    for arm in ("one", "many", "sort"):
        if arm == "sort":
            calls = [lambda i=i: fm.moe_align_ref(i, block, E) for i in ids]
        else:
            fm.ALIGN_ONE_PROGRAM_MAX_PAIRS = 1 << 30 if arm == "one" else 0
            calls = [lambda i=i: fm.moe_align_block_size(i, block, E) for i in ids]
        if arm == "one" and T * K > 16384:
            row.append(float("nan"))
            continue
        row.append(time_calls(calls, "cuda") * 1e6)
    print(f"{T:6d} {T * K:6d} {block:6d} {row[0]:12.1f} {row[1]:9.1f} {row[2]:8.1f}")
