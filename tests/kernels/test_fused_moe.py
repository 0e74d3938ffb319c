"""kernels/fused_moe.py against its PyTorch reference (CPU: TRITON_INTERPRET=1, small shapes).

Tolerance |out - ref| <= atol + rtol |ref|: fp32 (1e-5, 1e-5); fp16 (2e-3, 2e-3) and bf16 (1.6e-2,
1.6e-2), about two units in the last place of the output dtype: the kernel rounds the SiLU-gated
activation to the input dtype between the two projections (as vLLM does), the reference keeps
fp32 throughout.
"""
from kernels.testing import use_interpreter_without_gpu

DEVICE = use_interpreter_without_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.fused_moe import (block_size_m, fused_moe, fused_moe_pass, fused_moe_ref,  # noqa: E402
                               moe_align_block_size, moe_align_ref, moe_route, reduce_pairs)
from kernels.moe_reference import moe_route_ref  # noqa: E402

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def _case(T, H, I, E, top_k, dtype, seed=0, num_slots=None):
    """Inputs with the experts placed at random slots of a larger pool (other slots hold noise)."""
    g = torch.Generator().manual_seed(seed)
    S = num_slots or E
    x = torch.randn(T, H, generator=g)
    w13 = torch.randn(S, 2 * I, H, generator=g) * H ** -0.5
    w2 = torch.randn(S, H, I, generator=g) * I ** -0.5
    probs = torch.rand(T, E, generator=g).softmax(-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    slot_map = torch.randperm(S, generator=g)[:E].int().to(DEVICE) if num_slots else None
    cast = lambda t: t.to(dtype).to(DEVICE)  # noqa: E731
    return cast(x), cast(w13), cast(w2), cast(weights), ids.to(DEVICE), slot_map


def _check(out, ref, dtype):
    atol, rtol = TOL[dtype]
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


def test_align_worked_example():
    a = moe_align_block_size(torch.tensor([[2, 0], [2, 1]]).to(DEVICE), 2, 3)
    assert a.sorted_token_ids.tolist() == [1, 4, 3, 4, 0, 2, 4, 4]
    assert a.expert_ids.tolist() == [0, 1, 2, -1] and a.num_tokens_post_padded.tolist() == [6]


def test_a_decode_steps_pairs_take_a_tile_per_expert():
    # one token's 8 pairs of 128 experts: room for 8 runs of 16 rows, so the fused MoE's grid has 8 M-tiles, not
    # the 121 that padding every one of the 128 experts would make
    ids = torch.randperm(128, generator=torch.Generator().manual_seed(0))[:8][None]
    for align in (moe_align_block_size(ids.to(DEVICE), 16, 128), moe_align_ref(ids.to(DEVICE), 16, 128)):
        assert len(align.sorted_token_ids) == 128 and align.num_tokens_post_padded.tolist() == [128]
        assert sorted(align.expert_ids.tolist()) == sorted(ids[0].tolist())


@pytest.mark.parametrize("T, top_k, E, block", [(1, 2, 8, 16), (13, 3, 5, 4), (40, 8, 64, 16)])
def test_align_invariants(T, top_k, E, block):
    ids = torch.stack([torch.randperm(E, generator=torch.Generator().manual_seed(t))[:top_k] for t in range(T)])
    a = moe_align_block_size(ids.to(DEVICE), block, E)
    numel = T * top_k
    sorted_ids = a.sorted_token_ids.tolist()
    assert len(sorted_ids) % block == 0 and len(a.expert_ids) == len(sorted_ids) // block
    assert sorted(i for i in sorted_ids if i < numel) == list(range(numel))  # each pair exactly once
    used = a.num_tokens_post_padded.item()
    assert all(i == numel for i in sorted_ids[used:]) and all(e == -1 for e in a.expert_ids[used // block:].tolist())
    flat = ids.reshape(-1).tolist()
    for tile, e in enumerate(a.expert_ids[: used // block].tolist()):  # one expert per tile
        assert all(flat[p] == e for p in sorted_ids[tile * block:(tile + 1) * block] if p < numel)


@pytest.mark.parametrize("T, top_k, E, block, dtype", [(1, 8, 128, 16, torch.int64), (33, 8, 60, 16, torch.int32),
                                                     (200, 2, 8, 64, torch.int64), (7, 3, 5, 4, torch.int32),
                                                     (520, 8, 128, 128, torch.int32)])
def test_align_kernel_equals_the_sort(T, top_k, E, block, dtype):
    # one program (8 and 21 pairs) or programs of 256 pairs (264 and 400 pairs: 2; 4,160: 17, more than the place
    # kernel reads at once), experts not a power of two, int32 and int64 ids
    g = torch.Generator().manual_seed(T)
    ids = torch.randint(0, E, (T, top_k), generator=g).to(dtype).to(DEVICE)  # repeats within a token too
    got, ref = moe_align_block_size(ids, block, E), moe_align_ref(ids, block, E)
    for a, b in zip(got[:3], ref[:3]):
        assert a.dtype == b.dtype and a.tolist() == b.tolist()


@pytest.mark.parametrize("T, top_k, E", [(1, 8, 128), (33, 8, 60), (600, 8, 16)])
def test_align_adds_each_experts_weighted_pairs_to_the_counts(T, top_k, E):
    # one program (8 pairs) or several (264, 4,800): totals += the pair weights (0 for a graph's padding)
    g = torch.Generator().manual_seed(T)
    ids = torch.randint(0, E, (T, top_k), generator=g).to(DEVICE)
    pair_weights = (torch.rand(T * top_k + 5, generator=g) < 0.8).double().to(DEVICE)
    totals = torch.arange(E, dtype=torch.float64, device=DEVICE)  # added to, not overwritten
    expected = totals.clone().index_add_(0, ids.flatten(), pair_weights[:T * top_k])
    got = moe_align_block_size(ids, 16, E, counts=(totals, pair_weights))
    assert torch.equal(totals, expected)
    for a, b in zip(got[:3], moe_align_block_size(ids, 16, E)[:3]):  # the alignment is unchanged
        assert a.tolist() == b.tolist()


@pytest.mark.parametrize("E, top_k, normalize", [(128, 8, True), (60, 4, False), (8, 2, True)])
@pytest.mark.parametrize("seeded", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_route_equals_softmax_topk(E, top_k, normalize, seeded, padded):
    g = torch.Generator().manual_seed(E)
    T = 6
    logits = (torch.randn(T, E + 3, generator=g) * 2)[:, :E].to(DEVICE)  # a row stride of E + 3
    seed = (None, None)
    if seeded:  # the experts of each token's bucket
        routes = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(5)]).to(DEVICE)
        seed = (routes, torch.tensor([4, 0, 2, 2, 1, 3]).to(DEVICE))
    valid = torch.tensor([True, True, False, True, False, False]).to(DEVICE) if padded else None
    weights, ids = moe_route(logits, top_k, normalize, *seed, valid)
    ref_weights, ref_ids = moe_route_ref(logits, top_k, normalize, *seed, valid)
    assert ids.dtype == ref_ids.dtype and ids.tolist() == ref_ids.tolist()
    torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=1e-5)
    if padded:  # a graph's padding rows: the first row's experts, nothing of their own, at weight 0
        assert all(ids[t].tolist() == ids[0].tolist() and not weights[t].any() for t in (2, 4, 5))
        assert weights[3].any()
    fp16 = moe_route(logits.half(), top_k, normalize, *seed, valid)[0]  # the weights in the logits' dtype
    assert fp16.dtype == torch.float16


@pytest.mark.parametrize("E, top_k", [(128, 8), (60, 4), (8, 2)])
@pytest.mark.parametrize("seeded", [False, True])
def test_one_tokens_routing_lays_out_its_pairs_for_the_fused_moe(E, top_k, seeded):
    """`moe_route(align=True)` (a decode step at batch 1): the same weights and experts, a tile per pair (pair j
    in tile j, then padding), the counts `moe_align_block_size` adds, and the same MoE output as its sort."""
    g = torch.Generator().manual_seed(E + seeded)
    logits = torch.randn(1, E, generator=g).to(DEVICE)
    seed = ((torch.randperm(E, generator=g)[:top_k][None].to(DEVICE), torch.zeros(1, dtype=torch.long).to(DEVICE))
            if seeded else (None, None))
    pair_weights = torch.tensor([1.0] * top_k + [0.0], dtype=torch.float64, device=DEVICE)
    totals = torch.arange(E, dtype=torch.float64, device=DEVICE)  # added to, not overwritten
    weights, ids, align = moe_route(logits, top_k, True, *seed, align=True, counts=(totals, pair_weights))
    ref_weights, ref_ids = moe_route(logits, top_k, True, *seed)
    assert ids.tolist() == ref_ids.tolist() and torch.equal(weights, ref_weights)
    block = block_size_m(top_k, E)
    assert align.block_size == block and align.num_tokens_post_padded.tolist() == [top_k * block]
    assert align.expert_ids.tolist() == ids[0].tolist()
    assert align.sorted_token_ids.view(top_k, block).tolist() == [[j] + [top_k] * (block - 1) for j in range(top_k)]
    expected = torch.arange(E, dtype=torch.float64, device=DEVICE).index_add_(0, ids[0], pair_weights[:top_k])
    assert torch.equal(totals, expected)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 32, generator=g).to(DEVICE)
    w13, w2 = torch.randn(E, 2 * 16, 32, generator=g).to(DEVICE) / 6, torch.randn(E, 32, 16, generator=g).to(DEVICE) / 4
    assert torch.equal(fused_moe(x, w13, w2, weights, ids, align=align), fused_moe(x, w13, w2, weights, ids))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dtypes(dtype):
    # H and I not multiples of the tiles: masked K and N edges
    args = _case(T=5, H=40, I=24, E=4, top_k=2, dtype=dtype, seed=1)
    _check(fused_moe(*args), fused_moe_ref(*args), dtype)


@pytest.mark.parametrize("T, E, top_k", [(1, 8, 2), (3, 16, 8), (70, 4, 2), (9, 4, 1), (130, 2, 2)])
def test_shapes_and_tiles(T, E, top_k):
    # decode (one token), many experts, prefill tiles (M-tile 32 for 35 pairs per expert; 128 for 130), top-1
    args = _case(T=T, H=32, I=48, E=E, top_k=top_k, dtype=torch.float32, seed=T)
    _check(fused_moe(*args), fused_moe_ref(*args), torch.float32)
    assert block_size_m(70 * 2, 4) == 32 and block_size_m(180 * 2, 4) == 64 and block_size_m(8, 128) == 16
    assert block_size_m(2048 * 8, 128) == 128


def test_unreduced_pairs_sum_to_the_output():
    x, w13, w2, weights, ids, _ = _case(T=5, H=32, I=16, E=6, top_k=3, dtype=torch.float32, seed=4)
    pairs = fused_moe(x, w13, w2, weights, ids, reduce=False)
    assert pairs.shape == (5, 3, 32)
    assert torch.equal(reduce_pairs(pairs.flatten(0, 1), 3, x.dtype), fused_moe(x, w13, w2, weights, ids))


def test_reads_experts_through_the_slot_map():
    x, w13, w2, weights, ids, slot_map = _case(T=6, H=32, I=16, E=5, top_k=2, dtype=torch.float32, num_slots=9)
    out = fused_moe(x, w13, w2, weights, ids, slot_map)
    stacked = fused_moe_ref(x, w13[slot_map.long()], w2[slot_map.long()], weights, ids)  # experts gathered
    _check(out, stacked, torch.float32)


def test_passes_over_disjoint_slots_fill_every_pair():
    """Two passes, each with half the experts in the slot map (the others -1), equal one call."""
    T, H, I, E, k = 7, 32, 16, 6, 2
    x, w13, w2, weights, ids, slot_map = _case(T, H, I, E, k, torch.float32, seed=3, num_slots=E)
    align = moe_align_block_size(ids, 16, E)
    act = torch.empty(T * k, I, device=DEVICE)
    pairs = torch.full((T * k, H), float("nan"), device=DEVICE)  # every row must be written once
    for half in (range(0, 3), range(3, 6)):
        part = torch.full((E,), -1, dtype=torch.int32, device=DEVICE)
        part[list(half)] = slot_map[list(half)]
        fused_moe_pass(x, w13, w2, weights, align, part, act, pairs)
    _check(reduce_pairs(pairs, k, x.dtype), fused_moe(x, w13, w2, weights, ids, slot_map), torch.float32)
