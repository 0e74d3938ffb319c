"""kernels/trellis_viterbi.py against `backend.trellis.quantize`, the PyTorch Viterbi search (CPU:
TRITON_INTERPRET=1).

Tolerance: both search the same trellis and sum each cost in the same order, so the codes are equal; compiled
for the GPU the kernel may fuse a multiply-add, which can break a near-tie the other way, so a vector may take
another path of the same squared error (within 1e-5 of it).
"""
from kernels.testing import use_interpreter_without_gpu

DEVICE = use_interpreter_without_gpu()

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from backend import trellis  # noqa: E402
from kernels.trellis_viterbi import trellis_quantize  # noqa: E402

SMOLLM2_KV = Path(__file__).resolve().parents[2] / "kernels" / "testdata" / "smollm2_kv.pt"


def _check(x: torch.Tensor, k: int, L: int | None = None):
    ref = trellis.quantize(x, k, L)
    got = trellis_quantize(x.to(DEVICE), k, trellis.codebook(k, L, DEVICE)).cpu()
    assert got.dtype == torch.int32 and got.shape == x.shape and 0 <= got.min() and got.max() < 1 << k
    err = lambda codes: (trellis.dequantize(codes, k, L) - x).square().sum(1)                     # noqa: E731
    assert torch.allclose(err(got), err(ref), rtol=1e-5, atol=1e-6)
    same = (got == ref).all(1).float().mean().item()
    assert same >= (1.0 if DEVICE == "cpu" else 0.98), same


@pytest.mark.parametrize("k, L", [(k, None) for k in sorted(trellis.DEFAULT_STATE_BITS)] + [(3, 12)])
def test_codes_equal_the_reference_on_gaussians_with_outliers(k, L):
    g = torch.Generator().manual_seed(k)
    x = torch.randn(16, 64, generator=g)
    x[::5, 7] = 6.0                                    # values far beyond the table's range
    _check(x, k, L)


@pytest.mark.parametrize("n", [8, 32])
def test_short_vectors(n):
    _check(torch.randn(8, n, generator=torch.Generator().manual_seed(n)), 3)


def test_real_smollm2_values_scaled_to_unit_rms():
    v = torch.load(SMOLLM2_KV)["v3"][:8].float().reshape(-1, 64)          # 24 token-heads of layer 3
    _check(v / v.square().mean(1, keepdim=True).sqrt(), 2)


def test_refuses_lengths_that_are_not_powers_of_two():
    with pytest.raises(ValueError, match="power-of-two"):
        trellis_quantize(torch.zeros(2, 48, device=DEVICE), 3, trellis.codebook(3, device=DEVICE))
