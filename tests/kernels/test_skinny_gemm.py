"""kernels/skinny_gemm.py against x @ w.T in fp32 (CPU: TRITON_INTERPRET=1): whole and split over K, the partial
products summed as the next RMSNorm sums them."""
from kernels.testing import use_interpreter_without_gpu

DEVICE = use_interpreter_without_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.norms import rms_norm, rms_norm_ref  # noqa: E402
from kernels.skinny_gemm import skinny_linear  # noqa: E402


def _inputs(M, N, K, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K + 8, generator=g)[:, :K]  # a row stride wider than K
    w = torch.randn(N, K, generator=g) / K ** 0.5
    return x.to(dtype).to(DEVICE), w.to(dtype).to(DEVICE)


@pytest.mark.parametrize("M, N, K", [(1, 96, 512), (5, 70, 300), (16, 33, 1000)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_whole_product_equals_the_matmul(M, N, K, dtype):
    # N and K off the tiles (masked edges), up to the 16 rows a launch takes
    x, w = _inputs(M, N, K, dtype, seed=M)
    got = skinny_linear(x, w, config={"BLOCK_N": 32, "BLOCK_K": 128})
    ref = x.float() @ w.float().T
    assert got.shape == (M, N) and got.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(got.float(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("splits", [2, 3, 8])
def test_split_partials_sum_to_the_product_and_feed_the_norm(splits):
    # K 1,000: parts of 384, 384, 232; or 8 of 128, the last 104 (masked)
    x, w = _inputs(3, 64, 1000, torch.float32, seed=splits)
    parts = skinny_linear(x, w, splits=splits, config={"BLOCK_N": 32, "BLOCK_K": 128})
    ref = x @ w.T
    assert parts.shape == (3, splits, 64)
    torch.testing.assert_close(parts.sum(1), ref, atol=1e-4, rtol=1e-4)
    residual = torch.randn(3, 64).to(DEVICE)
    weight = torch.rand(64).to(DEVICE) + 0.5
    total, normed = rms_norm(parts, weight, 1e-6, residual)  # the partials summed in the norm's launch
    ref_total, ref_normed = rms_norm_ref(ref, weight, 1e-6, residual)
    torch.testing.assert_close(total, ref_total, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(normed, ref_normed, atol=1e-4, rtol=1e-4)


def test_more_rows_than_a_launch_takes_are_refused():
    x, w = _inputs(17, 32, 64, torch.float32)
    with pytest.raises(AssertionError):
        skinny_linear(x, w)
