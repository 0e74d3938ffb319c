"""CPU A/B of the keys' residual-code layout in the PyTorch path the CPU server takes: ALRKVDFormat.decode of 32 blocks
(the served smollm2 preset from model_repository/smollm2/config.pbtxt, 3 kv heads, head_dim 64, random data), codes
token-major (the layout before BENCHMARKS.md section 2s) against head-major, alternated, 2 threads:

    PYTHONPATH=. .venv/bin/python benchmarks/results/alrkvd_ceiling_2026-12-03/cpu_layout.py
"""
import json
import time

import torch

import backend.kv_formats as kf

PRESET = json.loads('{"block_size": 64, "k_bits": 4, "v_bits": 4, "rank_budget": 8, "latent_bits": 4, '
                    '"basis_bits": 4, "scale_bits": 8}')
STEPS = 30


def decode_ms(layout: str) -> float:
    alloc = kf.KVFormat._alloc
    if layout == "token":  # the keys' codes allocated in their logical order, [T, H, packed]
        kf.KVFormat._alloc = lambda self, name, shape, dtype, order=None: alloc(
            self, name, shape, dtype, None if name == "k_resid" else order)
    try:
        fmt = kf.make_format("alrkvd", 30, 3, 64, torch.float32, "cpu", num_blocks=40, **PRESET)
    finally:
        kf.KVFormat._alloc = alloc
    for b in range(32):
        fmt.encode(0, b, torch.randn(64, 3, 64), torch.randn(64, 3, 64))
    ids = list(range(32))
    for _ in range(3):
        fmt.decode(0, ids)
    t = time.perf_counter()
    for _ in range(STEPS):
        fmt.decode(0, ids)
    print(layout, "k_resid strides", fmt.k_resid.stride())
    return (time.perf_counter() - t) / STEPS * 1e3


torch.manual_seed(0)
torch.set_num_threads(2)
for _ in range(4):
    for layout in ("token", "head"):
        print(f"{layout}: {decode_ms(layout):.2f} ms per decode of 32 blocks")
