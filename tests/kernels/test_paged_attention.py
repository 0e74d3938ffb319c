"""kernels/paged_attention.py against its PyTorch reference (CPU: TRITON_INTERPRET=1, small shapes).

Tolerance |out - ref| <= atol + rtol |ref|, (atol, rtol): fp16 (2e-3, 2e-3), bf16 (1.5e-2, 1.6e-2),
fp32 (1e-4, 1e-4); rtol is two units in the last place of the output dtype (outliers make outputs
of magnitude ~30, and both sides round to the output dtype). The kernel rounds the softmax
weights to the cache dtype before tl.dot (as FlashAttention does); the reference computes in fp32.
"""
from kernels.testing import make_block_tables, random_kv, use_interpreter_without_gpu

DEVICE = use_interpreter_without_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.paged_attention import (MAX_SPLITS, TILE_PARTIALS_BYTES, tile_num_splits,  # noqa: E402
                                     paged_decode_attention, paged_decode_attention_ref, paged_tiles_attention,
                                     query_tiles, store_kv, store_kv_ref, tile_tokens,
                                     wave_num_splits)

TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.5e-2, 1.6e-2), torch.float32: (1e-4, 1e-4)}


def _case(seq_lens, num_kv_heads, group, head_dim, block_size, dtype, seed=0, pad_blocks=None):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 3
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = random_kv(shape, dtype, gen)
    v_cache = random_kv(shape, dtype, gen, channel_outliers=0)
    q = random_kv((len(seq_lens), num_kv_heads * group, head_dim), dtype, gen)
    block_tables = make_block_tables(seq_lens, block_size, num_blocks, gen, pad_to=pad_blocks)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    return [t.to(DEVICE) for t in (q, k_cache, v_cache, block_tables, seq_lens_t)]


def _check(args, dtype, num_splits=None):
    q = args[0]
    scale = q.shape[-1] ** -0.5
    out = paged_decode_attention(*args, scale, num_splits=num_splits)
    ref = paged_decode_attention_ref(*args, scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("block_size", [16, 128])
def test_gqa_and_block_sizes(group, block_size):
    # odd lengths, a partly filled last block, one sequence of a single token
    args = _case([1, 37, 300], num_kv_heads=2, group=group, head_dim=64, block_size=block_size,
                 dtype=torch.float16, seed=group * 1000 + block_size)
    _check(args, torch.float16, num_splits=3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dtypes(dtype):
    args = _case([129, 64], num_kv_heads=2, group=4, head_dim=128, block_size=16, dtype=dtype)
    _check(args, dtype, num_splits=2)


@pytest.mark.parametrize("num_splits", [1, 5, None])
def test_splits(num_splits):
    # 5 splits of 200 tokens: uneven, and more splits than tiles for the short sequence (empty splits)
    args = _case([200, 3], num_kv_heads=1, group=3, head_dim=64, block_size=16, dtype=torch.float16,
                 pad_blocks=20)
    _check(args, torch.float16, num_splits=num_splits)


def test_many_splits():
    # a launch of 37 splits for a 2,100-token sequence (33 tiles of 64 tokens): 9 splits of at least 4 tiles
    # (MIN_TOKENS_PER_SPLIT) take them and the merge reads those 9; the short sequence's one split, the rest idle
    args = _case([2100, 40], num_kv_heads=1, group=4, head_dim=64, block_size=16, dtype=torch.float16)
    _check(args, torch.float16, num_splits=37)


@pytest.mark.parametrize("min_tokens", [32, 512])
def test_a_launch_config_sets_the_tiles_and_the_split_length(min_tokens):
    # what benchmarks/tune_paged_decode.py sweeps: tiles of 32 tokens, splits of at least 32 or 512 tokens
    args = _case([700, 90], num_kv_heads=2, group=4, head_dim=64, block_size=16, dtype=torch.float16, pad_blocks=64)
    config = {"BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "MIN_TOKENS_PER_SPLIT": min_tokens}
    out = paged_decode_attention(*args, 0.125, config=config)
    torch.testing.assert_close(out.float(), paged_decode_attention_ref(*args, 0.125).float(), atol=2e-3, rtol=2e-3)


def test_block_boundaries():
    # lengths exactly on block and tile boundaries, and one past
    args = _case([16, 64, 65, 128], num_kv_heads=1, group=4, head_dim=32, block_size=16,
                 dtype=torch.float16)
    _check(args, torch.float16, num_splits=2)


def test_strided_query():
    # q as a view of a fused qkv projection output: head_dim contiguous, batch stride larger
    args = _case([50, 70], num_kv_heads=2, group=3, head_dim=64, block_size=16, dtype=torch.float16)
    q = args[0]
    fused = torch.zeros(q.shape[0], q.shape[1] + 4, q.shape[2], dtype=q.dtype, device=q.device)
    fused[:, : q.shape[1]] = q
    _check([fused[:, : q.shape[1]]] + args[1:], torch.float16, num_splits=2)


def test_reference_matches_sdpa():
    # the reference itself against torch SDPA on the gathered sequence
    args = _case([45], num_kv_heads=2, group=3, head_dim=64, block_size=16, dtype=torch.float32)
    q, k_cache, v_cache, block_tables, seq_lens = args
    ref = paged_decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, 0.125)
    blocks = block_tables[0, :3].long()
    k = k_cache[blocks].flatten(0, 1)[:45].transpose(0, 1)  # [Hkv, L, D]
    v = v_cache[blocks].flatten(0, 1)[:45].transpose(0, 1)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q[0][:, None], k, v, scale=0.125, enable_gqa=True)[:, 0]
    torch.testing.assert_close(ref[0], sdpa, atol=1e-5, rtol=1e-5)


def test_empty_sequence():
    # a padding row (seq_len 0, as in a padded CUDA-graph batch) gives zeros, not NaN
    args = _case([0, 20], num_kv_heads=2, group=4, head_dim=64, block_size=16, dtype=torch.float16)
    _check(args, torch.float16, num_splits=2)
    out = paged_decode_attention(*args, 0.125, num_splits=2)
    assert torch.all(out[0] == 0)


def test_merge_leaves_the_callers_tickets_at_zero():
    # the last split of each (sequence, kv head) merges; a CUDA graph replays the call with the same tickets
    args = _case([40, 7, 300], num_kv_heads=2, group=3, head_dim=32, block_size=16, dtype=torch.float16)
    tickets = torch.zeros(8, dtype=torch.int32, device=DEVICE)
    first = paged_decode_attention(*args, 0.2, num_splits=4, tickets=tickets)
    assert tickets.tolist() == [0] * 8
    assert torch.equal(paged_decode_attention(*args, 0.2, num_splits=4, tickets=tickets), first)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_store_kv_writes_each_token_where_indexing_does(dtype):
    # a step's keys from a wider projection (a row stride), into 16-bit paged blocks or a float32 window
    g = torch.Generator().manual_seed(5)
    T, H, D = 5, 3, 16
    k = torch.randn(T, H * D + 8, generator=g)[:, :H * D].view(T, H, D).to(DEVICE)
    v = torch.randn(T, H, D, generator=g).to(DEVICE)
    rows, offsets = torch.tensor([4, 0, 4, 2, 1]).to(DEVICE), torch.tensor([0, 7, 3, 3, 0]).to(DEVICE)
    got = [torch.randn(6, 8, H, D, generator=g).to(dtype).to(DEVICE) for _ in range(2)]
    ref = [t.clone() for t in got]
    store_kv(k, v, *got, rows, offsets)
    store_kv_ref(k, v, *ref, rows, offsets)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_tile_num_splits_cover_the_context_within_the_partials_budget():
    """A tiles launch's splits: enough of TILE_SPLIT_TOKENS for the longest context, however many tiles the launch
    has (a graph's fixed grid), at most what TILE_PARTIALS_BYTES of partials hold."""
    assert tile_num_splits(322, 32, 128, 8192) == 8
    assert tile_num_splits(64, 32, 128, 40960) == 40
    assert tile_num_splits(2048, 32, 128, 40960) == TILE_PARTIALS_BYTES // (2048 * 32 * 128 * 4) == 8
    assert tile_num_splits(16, 32, 128, 500) == 1
    assert tile_num_splits(16, 32, 128, 40960, min_tokens=256) == MAX_SPLITS


def test_wave_num_splits_fills_whole_waves():
    # the H200 measurements behind it (BENCHMARKS.md 2i): 3 programs per SM x 132 SMs, B=8 x 8 kv heads, 510 tiles
    assert wave_num_splits(64, 510, 396, 64) == 6        # 384 programs: one wave (9 splits took two)
    assert wave_num_splits(256, 510, 396, 64) == 3       # B=32: 768 programs, two full waves
    assert wave_num_splits(8, 62, 264, 31) == 31         # B=1 L=4k: every split in one wave, capped by most
    assert wave_num_splits(64, 512, 528, 64) == 8        # 4 programs per SM: 512 programs in one wave
    assert wave_num_splits(1024, 10, 100, 5) == 1        # more pairs than a wave: no splitting
    assert wave_num_splits(8, 100, 264, 0) == 1          # at least one split
    # the windows' programs (ALR-KVD: one more per pair, after the splits) counted at 2.5 tiles each: B=8 L=4k takes
    # 7 splits, whose wave holds the windows too; at L=32k a split fewer costs more than the windows' wait
    assert wave_num_splits(64, 31, 528, 31, 2.5) == 7
    assert wave_num_splits(64, 255, 528, 64, 2.5) == 8


def test_query_tiles_from_a_first_row():
    # a decode, a decode, a 5-row chunk: tiles of 2 rows from row 3 on leave the first three rows to another launch
    assert query_tiles([1, 1, 5], 2) == ([0, 1, 2, 4, 6], [1, 1, 2, 2, 1])
    assert query_tiles([1, 1, 5], 2, first_row=3) == ([3, 5], [2, 2])
    assert query_tiles([1, 1, 5], 2, first_row=7) == ([], [])


@pytest.mark.parametrize("group,dtype,num_splits,min_split_tokens", [
    (3, torch.float16, 3, 16), (8, torch.bfloat16, 1, 1024), (4, torch.float32, 2, 1024), (4, torch.float16, 7, 32)])
def test_query_tiles_equal_decode_rows(group, dtype, num_splits, min_split_tokens, monkeypatch):
    """A step of prompt chunks and decodes in tiles (`paged_tiles_attention`) gives what the decode kernel's
    reference gives for the same query rows: each row over its own causal context. Chunks longer than a
    tile, a chunk starting mid-block, single decode tokens, and unused tiles at the end; splits of at least
    `min_split_tokens` keys, the last ones empty for short contexts, whose partials stay unwritten (the buffers
    start as NaN here) and are not read."""
    empty = torch.empty

    def nan_empty(*shape, **kw):
        t = empty(*shape, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t
    monkeypatch.setattr(torch, "empty", nan_empty)
    gen = torch.Generator().manual_seed(group)
    block_size, num_kv_heads, head_dim = 16, 2, 64
    lens, chunks = [70, 5, 150, 1, 33], [70, 1, 40, 1, 20]  # each sequence's cached tokens after the step, its rows
    num_blocks = sum(-(-n // block_size) for n in lens) + 2
    k_cache = random_kv((num_blocks, block_size, num_kv_heads, head_dim), dtype, gen)
    v_cache = random_kv((num_blocks, block_size, num_kv_heads, head_dim), dtype, gen, channel_outliers=0)
    seq_tables = make_block_tables(lens, block_size, num_blocks, gen)
    rows = [(i, pos) for i, (n, c) in enumerate(zip(lens, chunks)) for pos in range(n - c, n)]
    tables = seq_tables[[i for i, _ in rows]]
    seq_lens = torch.tensor([pos + 1 for _, pos in rows], dtype=torch.int32)
    q = random_kv((len(rows), num_kv_heads * group, head_dim), dtype, gen)
    starts, counts = query_tiles(chunks, tile_tokens(group))
    starts, counts = starts + [0, 0], counts + [0, 0]
    args = [t.to(DEVICE) for t in (q, k_cache, v_cache, tables, seq_lens)]
    tiles = [torch.tensor(x, dtype=torch.int32, device=DEVICE) for x in (starts, counts)]
    scale = head_dim ** -0.5
    out = paged_tiles_attention(*args, *tiles, scale, num_splits=num_splits, min_split_tokens=min_split_tokens)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), paged_decode_attention_ref(*args, scale).float(), atol=atol, rtol=rtol)
