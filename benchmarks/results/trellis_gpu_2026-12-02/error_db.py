"""Squared error of the trellis codes, 8/9 against 12 state bits, against the Lloyd-Max codes at the same bits,
printed: (1) unit Gaussians, vectors of 64, every shipped table; (2) real SmolLM2 keys and values
(kernels/testdata/smollm2_kv.pt, layers 3 and 20, ten blocks of 32 each) through the format at k3 v3 (the 4.36x
preset's options, as benchmarks/results/alrkvd_trellis_2026-12-02/error_db.py).
Usage: PYTHONPATH=. python benchmarks/results/trellis_gpu_2026-12-02/error_db.py"""
import math

import torch

import backend.kv_formats as kvf
from backend import trellis

torch.set_num_threads(1)
x = torch.randn(1000, 64, generator=torch.Generator().manual_seed(5))
for k, L in trellis.SHIPPED:
    lv = kvf.gauss_codebook(k)
    lm = (lv[torch.bucketize(x, (lv[1:] + lv[:-1]) / 2)] - x).square().mean().item()
    tc = (trellis.dequantize(trellis.quantize(x, k, L), k, L) - x).square().mean().item()
    print(f"gaussian {k} bits, {L} state bits: Lloyd-Max {lm:.5f}, trellis {tc:.5f}, {10 * math.log10(lm / tc):.2f} dB less")

d = torch.load("kernels/testdata/smollm2_kv.pt")
opts = dict(block_size=32, k_bits=3, v_bits=3, rank_budget=8, key_weight=8, latent_bits=4, basis_bits=4, scale_bits=8)


def relative_errors(**codes):
    f = kvf.make_format("alrkvd", 1, 3, 64, torch.float32, "cpu", num_blocks=10, **codes, **opts)
    err, ref = torch.zeros(2), torch.zeros(2)
    for layer in (3, 20):
        for b in range(10):
            k, v = (d[f"{n}{layer}"][b * 32:(b + 1) * 32].float() for n in "kv")
            kk, vv = f.roundtrip(k, v, 0, b)
            err += torch.stack([(kk - k).square().sum(), (vv - v).square().sum()])
            ref += torch.stack([k.square().sum(), v.square().sum()])
    return err / ref


lm = relative_errors(codebook="gauss")
for L in (None, 12):
    tc = relative_errors(codebook="trellis", trellis_state_bits=L)
    db = 10 * torch.log10(lm / tc)
    print(f"SmolLM2 k3 v3, trellis of {trellis.state_bits(3, L)} state bits: relative squared error keys {tc[0]:.5f}, "
          f"values {tc[1]:.5f} (Lloyd-Max {lm[0]:.5f}, {lm[1]:.5f}): {db[0]:.2f} / {db[1]:.2f} dB less")
