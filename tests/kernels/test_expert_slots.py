"""kernels/expert_slots.py: the one-program bookkeeping kernel equals its PyTorch reference, call by call, over
steps of routed experts (one pass and several), prefetches, LRU and LFU; the reference keeps its invariants."""
from kernels.testing import use_interpreter_without_gpu

DEVICE = use_interpreter_without_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.expert_slots import COUNTERS, place_experts, place_experts_ref  # noqa: E402


def new_state(E, S, device):
    return dict(slot_of=torch.full((E + 1,), -1, dtype=torch.int64, device=device),
                holder=torch.full((S + 1,), E, dtype=torch.int64, device=device),
                stamp=torch.full((S + 1,), -1, dtype=torch.int64, device=device),
                uses=torch.zeros(E + 1, dtype=torch.int64, device=device),
                fresh=torch.zeros(S + 1, dtype=torch.bool, device=device),
                predicted=torch.zeros(E + 1, dtype=torch.bool, device=device),
                order=torch.zeros(E, dtype=torch.int64, device=device),
                clock=torch.zeros((), dtype=torch.int64, device=device),
                counts=torch.zeros(len(COUNTERS), dtype=torch.int64, device=device),
                slot_map=torch.zeros(E, dtype=torch.int32, device=device),
                copy_dst=torch.zeros(E, dtype=torch.int64, device=device),
                copy_valid=torch.zeros(E, dtype=torch.bool, device=device))


@pytest.mark.parametrize("lfu", [False, True], ids=["lru", "lfu"])
@pytest.mark.parametrize("E,S,k,tokens", [(8, 3, 2, 1), (8, 4, 2, 5), (16, 5, 4, 3), (128, 64, 8, 8)])
def test_kernel_equals_reference(E, S, k, tokens, lfu):
    g = torch.Generator().manual_seed(E * 100 + S)
    base = 2 * S  # the third layer's rows of the pool
    kern, ref = new_state(E, S, DEVICE), new_state(E, S, "cpu")
    score = False
    for step in range(8):
        # prefetch: predicted experts (a skewed draw, so some repeat), then the step's routed experts in passes
        predicted = torch.randint(0, E, (tokens, k), generator=g)
        ids = torch.multinomial(torch.linspace(1, 3, E), tokens * k, replacement=True, generator=g).view(tokens, k)
        calls = [(predicted, 0, True, False)]
        union = min(tokens * k, E)
        calls += [(ids, p, False, step % 3 == 0) for p in range(-(-union // S))]
        for routed, p, prefetch, first_layer in calls:
            args = dict(base=base, pass_index=p, prefetch=prefetch, lfu=lfu, first_layer=first_layer,
                        score=score and not prefetch and p == 0)
            place_experts(routed.reshape(-1).to(DEVICE), **kern, **args)
            place_experts_ref(routed.reshape(-1), **ref, **args)
            score = prefetch or (score and p > 0)
            for name in ref:
                got, want = kern[name].cpu(), ref[name]
                if name == "slot_map" and prefetch:
                    continue  # not an output of a prefetch
                assert torch.equal(got[:E] if name in ("slot_of", "predicted", "uses") else got,
                                   want[:E] if name in ("slot_of", "predicted", "uses") else want), (step, p, name)
            if not prefetch:  # the pass's experts have distinct slots holding them
                placed = {e: s - base for e, s in enumerate(ref["slot_map"].tolist()) if s >= 0}
                assert len(set(placed.values())) == len(placed) and all(0 <= j < S for j in placed.values())
                assert all(ref["holder"][j] == e for e, j in placed.items())
    counts = dict(zip(COUNTERS, ref["counts"].tolist()))
    assert counts["misses"] > 0 and counts["prefetch_copies"] > 0 and counts["predicted"] > 0
