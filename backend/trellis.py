"""Trellis-coded quantization of Gaussian-like vectors: the tail-biting bitshift trellis of QTIP
(Tseng et al., 2024), used by ALR-KVD for its residual codes (``codebook=trellis``).

A vector of n values is stored as n symbols of k bits, exactly the bytes of k-bit scalar codes. Value t is
``codebook(k, L)[s_t]``, where the state s_t is the L bits of the L / k symbols up to t, read circularly
(tail-biting: no extra bits for the first states). The encoder picks all n symbols at once by the Viterbi
algorithm, whose work grows as 2**L. On unit Gaussians at 3 bits the default L = 9 gives 1.45 dB less squared
error than the scalar Lloyd-Max quantizer at the same bits (2 bits, L = 8: 1.25 dB); decoding one value needs
only its L / k symbols.

The codebooks (one table of 2**L values per k and L) are trained by Lloyd iterations over Viterbi assignments
of Gaussian samples and shipped in ``trellis_codebooks.safetensors``; ``python -m backend.trellis`` rewrites it.
"""
from __future__ import annotations

import functools
import os

import torch
from safetensors.torch import load_file, save_file

DEFAULT_STATE_BITS = {1: 8, 2: 8, 3: 9, 4: 8}   # L per symbol width k (a multiple of k); larger L: less error, 2**L work
CODEBOOK_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trellis_codebooks.safetensors")
SHIPPED = [(k, L) for k, L in DEFAULT_STATE_BITS.items()] + [(2, 12), (3, 12)]


def state_bits(k: int, L: int | None = None) -> int:
    """L, checked to be a multiple of k; None -> the default for k."""
    L = DEFAULT_STATE_BITS[k] if L is None else L
    if k not in DEFAULT_STATE_BITS or L % k:
        raise ValueError(f"a trellis needs symbols of 1 to 4 bits and state bits a multiple of them, got {k}, {L}")
    return L


def codebook(k: int, L: int | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
    """The trained table of 2**L float32 values for k-bit symbols (shared: read, do not modify)."""
    L = state_bits(k, L)
    if (k, L) not in SHIPPED:
        raise ValueError(f"no trained trellis table for {k}-bit symbols and {L} state bits; shipped: {SHIPPED}")
    return _table(f"k{k}_L{L}", device)


@functools.cache
def _table(name: str, device: torch.device | str) -> torch.Tensor:
    """One copy per device: the encoder and decoder ask for a table on every call."""
    return load_file(CODEBOOK_FILE)[name].to(device)


def states(codes: torch.Tensor, k: int, L: int | None = None) -> torch.Tensor:
    """Codes [..., n] (k-bit symbols) -> the state of every position [..., n] (long): the L // k symbols up to
    it, read circularly, the newest in the low bits."""
    codes = codes.long()
    return sum(torch.roll(codes, j, dims=-1) << (j * k) for j in range(state_bits(k, L) // k))


def dequantize(codes: torch.Tensor, k: int, L: int | None = None, table: torch.Tensor | None = None) -> torch.Tensor:
    """Codes [..., n] -> values [..., n] (float32, unit scale)."""
    table = codebook(k, L, codes.device) if table is None else table
    return table[states(codes, k, L)]


def _forward(x: torch.Tensor, table: torch.Tensor, k: int, prefix: torch.Tensor | None):
    """The forward pass of the Viterbi search over x [N, n]: past [n, 2**(L - k), N], where past[t, p] is the
    cheapest path to step t - 1 ending in a state whose low L - k bits are p, and the last step's costs
    [2**L, N]. With ``prefix`` [N] (the first state's top L - k bits) the path starts there and is forced to
    end in it: a tail-biting path. Vectors are the inner dimension, so every op runs over contiguous rows."""
    N, n = x.shape
    S = table.numel()
    low, hi = S >> k, 1 << k      # state s = p * hi + a: p = s >> k its older bits, a the newest symbol
    # (x - c)^2 = x^2 + c^2 - 2xc, and x^2 is the same for every state: paths are ranked by -2xc + c^2
    sq, m2 = table.square()[:, None], -2 * table
    xt = x.t().contiguous()
    past = torch.empty(n, low, N, device=x.device)
    past[0] = 0
    if prefix is not None:
        past[0].masked_fill_(torch.arange(low, device=x.device)[:, None] != prefix, float("inf"))
    cost = torch.empty(S, N, device=x.device)
    for t in range(n):
        torch.outer(m2, xt[t], out=cost).add_(sq)
        cost.view(low, hi, N).add_(past[t, :, None])
        if t + 1 < n:               # min over the top k bits, which the next state drops
            torch.amin(cost.view(hi, low, N), 0, out=past[t + 1])
    if prefix is not None:
        cost.view(hi, low, N).masked_fill_(torch.arange(low, device=x.device)[:, None] != prefix, float("inf"))
    return past, cost


def _viterbi(x: torch.Tensor, table: torch.Tensor, k: int, prefix: torch.Tensor | None) -> torch.Tensor:
    """States [N, n] of the bitshift path closest to x [N, n] (tail-biting with ``prefix``, see `_forward`)."""
    N, n = x.shape
    low, hi = table.numel() >> k, 1 << k
    past, cost = _forward(x, table, k, prefix)
    path = torch.empty(N, n, dtype=torch.long, device=x.device)
    path[:, -1] = cost.argmin(0)
    tops = torch.arange(hi, device=x.device) * low
    sq, m2 = table.square(), -2 * table
    for t in range(n - 1, 0, -1):          # the cheapest predecessor of each chosen state, summed as forward
        pred = tops + (path[:, t] >> k)[:, None]                               # [N, hi]
        c = m2[pred] * x[:, t - 1, None] + sq[pred] + past[t - 1].t().gather(1, pred >> k)
        path[:, t - 1] = pred.gather(1, c.argmin(1, keepdim=True))[:, 0]
    return path


def quantize(x: torch.Tensor, k: int, L: int | None = None, table: torch.Tensor | None = None,
             chunk: int | None = None) -> torch.Tensor:
    """x [N, n] (unit scale) -> codes [N, n] (int32 k-bit symbols) of a tail-biting path. The first pass is
    free; its last state's low bits become the forced prefix of the second (QTIP's tail-biting heuristic).
    ``chunk`` vectors at a time (default: 2 MB of costs, [2**L, chunk] float32, about a core's L2 cache) bound the
    memory (the path costs, float32 [n, 2**(L - k), chunk]) and keep each step's costs in cache. On CUDA the
    same search runs as one Triton program per vector (kernels/trellis_viterbi.py; power-of-two lengths)."""
    table = codebook(k, L, x.device) if table is None else table
    if x.is_cuda and x.shape[-1] & (x.shape[-1] - 1) == 0:
        from kernels.trellis_viterbi import trellis_quantize
        return trellis_quantize(x, k, table)
    low = table.numel() >> k
    chunk = chunk or max(64, (1 << 19) // table.numel())
    out = []
    for xc in x.float().split(chunk):
        free_last = _forward(xc, table, k, None)[1].argmin(0)       # the free path's last state
        out.append(_viterbi(xc, table, k, free_last % low) % (1 << k))
    return torch.cat(out).to(torch.int32)


def train_codebook(k: int, L: int | None = None, iters: int | None = None, vectors: int | None = None, n: int = 64,
                   seed: int = 0) -> torch.Tensor:
    """Lloyd iterations (default max(12, 2**L // 100): larger tables converge slower): Viterbi-assign Gaussian
    samples (``vectors`` of n per iteration, default max(3000, 4 * 2**L)), move each entry to the mean of its
    samples. Starts from the Gaussian quantiles in a fixed random order."""
    L = state_bits(k, L)
    S = 1 << L
    iters = max(12, S // 100) if iters is None else iters
    vectors = max(3000, 4 * S) if vectors is None else vectors
    g = torch.Generator().manual_seed(seed)
    q = (torch.arange(S, dtype=torch.float64) + 0.5) / S
    table = torch.distributions.Normal(0.0, 1.0).icdf(q).float()[torch.randperm(S, generator=g)]
    for _ in range(iters):
        x = torch.randn(vectors, n, generator=g)
        s = states(quantize(x, k, L, table), k, L).flatten()
        num = torch.zeros(S).index_add_(0, s, x.flatten())
        cnt = torch.zeros(S).index_add_(0, s, torch.ones(x.numel()))
        table = torch.where(cnt > 0, num / cnt.clamp_min(1), table)
    return table


if __name__ == "__main__":
    torch.set_num_threads(os.cpu_count() or 1)
    save_file({f"k{k}_L{L}": train_codebook(k, L) for k, L in SHIPPED}, CODEBOOK_FILE)
    print("wrote", CODEBOOK_FILE)
