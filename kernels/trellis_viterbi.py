"""Viterbi search of the bitshift trellis (Triton): `backend.trellis.quantize` on the GPU.

One program per vector walks its n values twice, as the PyTorch reference does, with the costs of all 2**L
states in registers:
    free pass:        cost_t[s] = past_t[s >> k] + c[s]^2 - 2 x_t c[s];  past_{t+1}[p'] = min of cost_t over the
                      top k bits of s (which the next state drops), p' its low L - k bits
    tail-biting pass: the same, with the first state's older bits forced to the free path's last state's low bits
                      and the last state forced to end in them; which top bits won each min is stored (one byte
                      per state and step), and the path is read back from the end.
The PyTorch reference launches a few small kernels per step; here a whole vector is one program. Compiled, the
kernel may fuse a multiply-add, so a near-tie can pick another path of the same cost.

Public: `trellis_quantize(x, k, table)`; reference: `backend.trellis.quantize`. Nothing runs at import.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _forward(x_row, sq, m2, older, Past, Choice, prefix, N_STEPS: tl.constexpr, LOW: tl.constexpr,
             TAIL: tl.constexpr):
    """One pass over the n values. Costs are a [2**k, 2**(L-k)] tile: row a' (the top bits, which the next state
    drops), column p' (the low bits, which it keeps), state s = a' * LOW + p'. The best cost of each state's
    predecessors sits in memory (Past, two slots of LOW) and is gathered at s >> k: the bitshift permutes the
    states, and a load does that without reshuffling registers. Returns the last step's costs; with TAIL
    the path starts and ends with low bits ``prefix``, and each step's row choices go to Choice."""
    p = tl.arange(0, LOW)
    if TAIL:
        tl.store(Past + p, tl.where(p == prefix, 0.0, float("inf")))
    else:
        tl.store(Past + p, tl.zeros([LOW], tl.float32))
    tl.debug_barrier()
    for t in range(N_STEPS - 1):
        cost = sq + tl.load(x_row + t) * m2 + tl.load(Past + (t % 2) * LOW + older)
        tl.store(Past + ((t + 1) % 2) * LOW + p, tl.min(cost, 0))
        if TAIL:
            tl.store(Choice + (t + 1) * LOW + p, tl.argmin(cost, 0).to(tl.uint8))
        tl.debug_barrier()
    cost = sq + tl.load(x_row + N_STEPS - 1) * m2 + tl.load(Past + ((N_STEPS - 1) % 2) * LOW + older)
    if TAIL:
        cost = tl.where(p[None, :] == prefix, cost, float("inf"))
    return cost


@triton.jit
def _argmin_state(cost, LOW: tl.constexpr):
    """The state s = a' * LOW + p' of the smallest cost in the [2**k, LOW] tile."""
    col = tl.argmin(tl.min(cost, 0), 0)
    row = tl.sum(tl.where(tl.arange(0, LOW) == col, tl.argmin(cost, 0), 0), 0)
    return row * LOW + col


@triton.jit
def _viterbi_kernel(X, Sq, M2, Past, Choice, Codes, N_STEPS: tl.constexpr, LOW: tl.constexpr, HI: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    states = tl.arange(0, HI)[:, None] * LOW + tl.arange(0, LOW)[None, :]
    older = states // HI                                                          # the predecessors' low bits
    sq = tl.load(Sq + states)
    m2 = tl.load(M2 + states)
    x_row = X + row * N_STEPS
    past = Past + row * 2 * LOW
    choice = Choice + row * N_STEPS * LOW
    free = _forward(x_row, sq, m2, older, past, choice, 0, N_STEPS, LOW, False)
    prefix = _argmin_state(free, LOW) % LOW                                       # where the free path ended
    s = _argmin_state(_forward(x_row, sq, m2, older, past, choice, prefix, N_STEPS, LOW, True), LOW)
    tl.debug_barrier()                                                            # the choices are in memory

    steps = tl.arange(0, N_STEPS)
    codes = tl.where(steps == N_STEPS - 1, s % HI, 0)
    for i in range(N_STEPS - 1):                                                  # read the path back
        t = N_STEPS - 1 - i
        kept = s // HI
        s = tl.load(choice + t * LOW + kept).to(tl.int32) * LOW + kept
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
    past = torch.empty(N, 2, S >> k, device=x.device)
    choice = torch.empty(N, n, S >> k, dtype=torch.uint8, device=x.device)
    if N:
        _viterbi_kernel[(N,)](x, table.square().contiguous(), (-2 * table).contiguous(), past, choice, codes,
                              N_STEPS=n, LOW=S >> k, HI=1 << k, num_warps=2 if S <= 512 else 8)
    return codes
