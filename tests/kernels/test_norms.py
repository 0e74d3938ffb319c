"""kernels/norms.py against the PyTorch path it replaces (CPU: TRITON_INTERPRET=1).

fp32 to 1e-5 (the sum of squares is ordered differently); 16-bit outputs to two units in the last place
of their dtype (2^-9 / 2^-6 relative): a sum ordered differently can move the normalized value's rounding
by one unit, and the weight's product rounds again. Not bf16: the interpreter (triton 3.9) rounds fp32 to
bf16 toward zero, PyTorch and compiled kernels to nearest: bf16 is checked where the kernels compile.
"""
from kernels.testing import use_interpreter_without_gpu

DEVICE = use_interpreter_without_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels import norms  # noqa: E402
from kernels.norms import qk_norm_rope, qk_norm_rope_ref, rms_norm, rms_norm_ref  # noqa: E402
from kernels.testing import rope_tables  # noqa: E402

TOL = {torch.float32: 1e-5, torch.float16: 2 ** -9, torch.bfloat16: 2 ** -6}
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def _close(got, ref):
    assert got.shape == ref.shape and got.dtype == ref.dtype
    tol = TOL[ref.dtype]
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, with_residual):
    g = torch.Generator().manual_seed(0)
    N = 96  # not a power of two: masked columns
    x = (torch.randn(5, N + 8, generator=g) * 3)[:, :N].to(dtype).to(DEVICE)  # a row stride of N + 8
    w = (1 + torch.randn(N, generator=g) / 4).to(dtype).to(DEVICE)
    res = torch.randn(5, N, generator=g).to(dtype).to(DEVICE) if with_residual else None
    got, ref = rms_norm(x, w, 1e-6, res), rms_norm_ref(x, w, 1e-6, res)
    if with_residual:
        assert torch.equal(got[0], ref[0])  # the sum is rounded once, as PyTorch's add
        got, ref = got[1], ref[1]
    _close(got, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_sums_a_moes_pairs_first(dtype):
    # x [T, top_k, N]: a MoE's unreduced pairs (fused_moe(reduce=False)), summed in fp32 and rounded once
    g = torch.Generator().manual_seed(2)
    T, P, N = 4, 8, 96
    pairs = torch.randn(T, P, N, generator=g).to(dtype).to(DEVICE)
    w = (1 + torch.randn(N, generator=g) / 4).to(dtype).to(DEVICE)
    res = torch.randn(T, N, generator=g).to(dtype).to(DEVICE)
    summed = pairs.sum(1, dtype=torch.float32).to(dtype)  # as fused_moe.reduce_pairs
    (total, out), (ref_total, ref_out) = rms_norm(pairs, w, 1e-6, res), rms_norm_ref(summed, w, 1e-6, res)
    _close(total, ref_total)
    _close(out, ref_out)
    _close(rms_norm(pairs, w, 1e-6), rms_norm_ref(summed, w, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("heads_per_program", [8, 4])  # 6 head rows: one program, or two (q heads, then kv)
def test_qk_norm_rope(dtype, norm, heads_per_program, monkeypatch):
    monkeypatch.setattr(norms, "QK_HEADS_PER_PROGRAM", heads_per_program)
    g = torch.Generator().manual_seed(1)
    T, Hq, Hkv, D = 3, 4, 2, 32
    qkv = (torch.randn(T, (Hq + 2 * Hkv) * D, generator=g) * 2).to(dtype).to(DEVICE)
    qw, kw = ((1 + torch.randn(D, generator=g) / 4).to(dtype).to(DEVICE) for _ in range(2))
    weights = (qw, kw) if norm else (None, None)
    tables = rope_tables(D, 64)
    positions = torch.tensor([0, 7, 41])
    cos = tables.cos[positions].unsqueeze(1).to(dtype).to(DEVICE)
    half = tables.sin[positions, : D // 2]
    signed_sin = torch.cat([-half, half], -1).unsqueeze(1).to(dtype).to(DEVICE)
    args = (qkv, Hq, Hkv, D, *weights, 1e-6, cos, signed_sin)
    for got, ref in zip(qk_norm_rope(*args), qk_norm_rope_ref(*args)):
        _close(got, ref)
