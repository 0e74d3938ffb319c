"""Viterbi search of the bitshift trellis (Triton): `backend.trellis.quantize` on the GPU.

One program per vector holds the costs of all 2**L states as a [2**(L-k), 2**k] tile (row: the state's older
bits p = s >> k, column: its newest symbol a) and walks the n values twice, as the PyTorch reference does:
    free pass:        cost_t[s] = past_t[s >> k] + c[s]^2 - 2 x_t c[s];  past_{t+1}[p] = min over the k bits
                      the next state drops (the [2**k, 2**(L-k)] view of the flat costs, min over rows)
    tail-biting pass: the same, with the first state's older bits forced to the free path's last state's low bits
                      and the last state forced to end in them; which row won each min is stored (one byte per
                      state and step), and the path is read back from the end.
The PyTorch reference launches a few small kernels per step; here a whole vector is one program. Its sums
may round differently (fused multiply-add), so a near-tie can pick the other path of equal cost.

Public: `trellis_quantize(x, k, table)`; reference: `backend.trellis.quantize`. Nothing runs at import.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _step_costs(sq, m2, past, x_t):
    """Costs [LOW, HI] of every state at one step, from the best costs [LOW] of their predecessors."""
    return sq + x_t * m2 + tl.expand_dims(past, 1)


@triton.jit
def _viterbi_kernel(X, Sq, M2, Choice, Codes, N_STEPS: tl.constexpr,
                    LOW: tl.constexpr, HI: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    p = tl.arange(0, LOW)
    states = p[:, None] * HI + tl.arange(0, HI)[None, :]                          # s = p * HI + a
    sq = tl.load(Sq + states)
    m2 = tl.load(M2 + states)
    x_row = X + row * N_STEPS
    choice_row = Choice + row * N_STEPS * LOW

    past = tl.zeros([LOW], tl.float32)                                            # free pass
    for t in range(N_STEPS - 1):
        past = tl.min(tl.reshape(_step_costs(sq, m2, past, tl.load(x_row + t)), [HI, LOW]), 0)
    last = tl.argmin(tl.reshape(_step_costs(sq, m2, past, tl.load(x_row + N_STEPS - 1)), [LOW * HI]), 0)
    prefix = last % LOW

    past = tl.where(p == prefix, 0.0, float("inf"))                               # tail-biting pass
    for t in range(N_STEPS - 1):
        cost = tl.reshape(_step_costs(sq, m2, past, tl.load(x_row + t)), [HI, LOW])
        past = tl.min(cost, 0)
        tl.store(choice_row + (t + 1) * LOW + p, tl.argmin(cost, 0).to(tl.uint8))
    cost = _step_costs(sq, m2, past, tl.load(x_row + N_STEPS - 1))
    cost = tl.where(states % LOW == prefix, cost, float("inf"))
    s = tl.argmin(tl.reshape(cost, [LOW * HI]), 0)
    tl.debug_barrier()                                                            # the choices are in memory

    steps = tl.arange(0, N_STEPS)
    codes = tl.where(steps == N_STEPS - 1, s % HI, 0)
    for i in range(N_STEPS - 1):                                                  # read the path back
        t = N_STEPS - 1 - i
        older = s // HI
        s = tl.load(choice_row + t * LOW + older).to(tl.int32) * LOW + older
        codes = tl.where(steps == t - 1, s % HI, codes)
    tl.store(Codes + row * N_STEPS + steps, codes)


def trellis_quantize(x: torch.Tensor, k: int, table: torch.Tensor) -> torch.Tensor:
    """x [N, n] (unit scale, n a power of two) -> codes [N, n] int32 of a tail-biting path (k-bit symbols)."""
    N, n = x.shape
    S = table.numel()
    if n & (n - 1) or S & (S - 1):
        raise ValueError(f"trellis_quantize needs power-of-two lengths and tables, got n={n}, {S} states")
    x = x.float().contiguous()
    table = table.float().to(x.device)
    codes = torch.empty(N, n, dtype=torch.int32, device=x.device)
    choice = torch.empty(N, n, S >> k, dtype=torch.uint8, device=x.device)
    if N:
        _viterbi_kernel[(N,)](x, table.square().contiguous(), (-2 * table).contiguous(), choice, codes,
                              N_STEPS=n, LOW=S >> k, HI=1 << k, num_warps=2 if S <= 512 else 8)
    return codes
