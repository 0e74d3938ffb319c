"""The trellis quantizer (backend/trellis.py): the Viterbi search finds the best tail-biting path, codes decode
to that path, and the shipped codebooks beat the scalar Lloyd-Max quantizer at the same bits."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from backend import trellis
from backend.kv_formats import gauss_codebook


@pytest.mark.parametrize("k, L", [(1, None), (2, None), (2, 12)])
def test_viterbi_finds_the_best_path_with_its_prefix(k, L):
    """Against every code vector of n symbols (n at least a state's symbols): the forced-prefix search returns the
    cheapest tail-biting path whose first state starts with the prefix; `quantize`'s codes decode to it."""
    n = max(6, trellis.state_bits(k, L) // k)
    table = trellis.codebook(k, L)
    low = table.numel() >> k
    x = torch.randn(3, n, generator=torch.Generator().manual_seed(k))
    every = torch.tensor(list(itertools.product(range(1 << k), repeat=n)))           # [2^(n k), n]
    paths = trellis.states(every, k, L)                                                 # their (tail-biting) states
    err = (table[paths][None] - x[:, None]).square().sum(-1)                          # [3, 2^(n k)]
    for i in range(3):
        for prefix in (0, 5 % low, low - 1):
            ok = paths[:, 0] // (1 << k) == prefix
            best = err[i][ok].min()
            path = trellis._viterbi(x[i:i + 1], table, k, torch.tensor([prefix]))
            assert path[0, 0] // (1 << k) == prefix and path[0, -1] % low == prefix
            assert torch.equal(trellis.states(path % (1 << k), k, L), path)           # a tail-biting path
            assert (table[path[0]] - x[i]).square().sum() == pytest.approx(best.item(), rel=1e-5, abs=1e-6)
    q = trellis.quantize(x, k, L)                  # the second pass's path, prefixed by where the free one ended
    prefix = trellis._viterbi(x, table, k, None)[:, -1] % low
    assert q.dtype == torch.int32 and torch.equal(trellis.dequantize(q, k, L), table[trellis._viterbi(x, table, k, prefix)])


# measured with the shipped codebooks on 1,000 unit-Gaussian vectors of 64 (benchmarks/results/trellis_gpu_2026-12-02/error_db.py): Lloyd-Max over trellis
GAIN_DB = {(1, 8): 0.70, (2, 8): 1.25, (3, 9): 1.45, (4, 8): 1.12, (2, 12): 1.68, (3, 12): 2.06}


@pytest.mark.parametrize("k, L", trellis.SHIPPED)
def test_codebooks_beat_lloyd_max_at_the_same_bits(k, L):
    x = torch.randn(2000, 64, generator=torch.Generator().manual_seed(7))
    lv = gauss_codebook(k)
    scalar = (lv[torch.bucketize(x, (lv[1:] + lv[:-1]) / 2)] - x).square().mean().item()
    coded = (trellis.dequantize(trellis.quantize(x, k, L), k, L) - x).square().mean().item()
    assert 10 * math.log10(scalar / coded) > GAIN_DB[k, L] - 0.2, (scalar, coded)


def test_only_shipped_tables():
    with pytest.raises(ValueError, match="no trained trellis table"):
        trellis.codebook(4, 12)
    with pytest.raises(ValueError, match="multiple"):
        trellis.states(torch.zeros(4, dtype=torch.int32), 3, 10)
