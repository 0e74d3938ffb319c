"""kernels/alrkvd_attention.py against its PyTorch reference (CPU: TRITON_INTERPRET=1, small shapes).

Data: blocks are compressed by backend.kv_formats.ALRKVDFormat itself with the options the kernel
reads (kernels.alrkvd_attention.KERNEL_OPTIONS; random data with outliers, and real SmolLM2-135M keys
and values, kernels/testdata/smollm2_kv.pt).

Tolerance. The kernel rebuilds keys and values and feeds tl.dot fp16 operands (the rotated
keys, the softmax weights, the latent and residual tiles; the residual is dequantized in fp16), as
FlashAttention does with an fp16 cache; the reference is fp32 throughout. The error that rounding the rebuilt keys and values to
fp16 alone causes, e16 = max|ref(kv fp16) - ref|, sets the budget:
    max|out - ref| <= 2 e16 + 2e-3 max(1, max|ref|)
(the second term: fp16 output rounding and fp32 summation order).
"""
from kernels.testing import check_decode_kernel, random_kv, to_device, use_interpreter_without_gpu

DEVICE = use_interpreter_without_gpu()

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import kernels.alrkvd_attention as alrkvd_mod  # noqa: E402
from kernels.alrkvd_attention import (  # noqa: E402
    alrkvd_decode_attention, alrkvd_decode_attention_ref, alrkvd_decode_blocks_ref, alrkvd_rebuild_blocks, rope_ref,
)

from alrkvd_cases import build_alrkvd_case  # noqa: E402  (tests/kernels/alrkvd_cases.py)

SMOLLM2_KV = Path(__file__).resolve().parents[2] / "kernels" / "testdata" / "smollm2_kv.pt"


def _random_case(lengths, num_kv_heads, gqa, head_dim, block_size, seed, **options):
    gen = torch.Generator().manual_seed(seed)
    kb, vb, wk, wv = [], [], [], []
    for n in lengths:
        closed, rest = divmod(n, block_size)
        kb.append([random_kv((block_size, num_kv_heads, head_dim), torch.float16, gen) for _ in range(closed)])
        vb.append([random_kv((block_size, num_kv_heads, head_dim), torch.float16, gen, channel_outliers=0)
                   for _ in range(closed)])
        wk.append(random_kv((rest, num_kv_heads, head_dim), torch.float16, gen))
        wv.append(random_kv((rest, num_kv_heads, head_dim), torch.float16, gen, channel_outliers=0))
    case = build_alrkvd_case(kb, vb, wk, wv, gen, block_size=block_size, **options)
    q = random_kv((len(lengths), num_kv_heads * gqa, head_dim), torch.float16, gen)
    return q, case


def _check(q, case, num_splits):
    case = to_device({k: v for k, v in case.items() if k != "fmt"}, DEVICE)
    q = q.to(DEVICE)
    out, stats = check_decode_kernel(alrkvd_decode_attention, alrkvd_decode_attention_ref, q, q.shape[-1] ** -0.5,
                                     num_splits, **case)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert stats["check_ok"], stats


@pytest.mark.parametrize("key_frame", ["post_rope", "rotated"])
def test_reference_decode_matches_format(key_frame):
    # the reference's block decode restates ALRKVDFormat.decode (values exactly; keys through RoPE and back)
    q, case = _random_case([3 * 32], num_kv_heads=2, gqa=1, head_dim=64, block_size=32, seed=1,
                           rank_per_head=6.0, key_frame=key_frame)
    fmt, blocks = case["fmt"], case["block_tables"][0, :3]
    k_fmt, v_fmt = fmt.decode(0, blocks.tolist(), start_pos=0)
    k_ref, v_ref = alrkvd_decode_blocks_ref(case["cache"], blocks, case["cos"], case["sin"])
    torch.testing.assert_close(v_ref.to(v_fmt.dtype), v_fmt, atol=0, rtol=0)
    k_fmt_rot = rope_ref(k_fmt, case["cos"][: k_fmt.shape[0]], case["sin"][: k_fmt.shape[0]])
    torch.testing.assert_close(k_ref, k_fmt_rot, atol=2e-2, rtol=2e-3)  # k_fmt is rounded to fp16


@pytest.mark.parametrize("options", [{"codebook": "gauss"}, {"rotate": "true"}, {"key_frame": "pre_rope"},
                                     {"group": 32}, {"k_bits": 3}])
def test_kernel_refuses_other_options(options):
    with pytest.raises(NotImplementedError):  # AlrkvdLayer.from_format, inside the case builder
        _random_case([32], num_kv_heads=2, gqa=1, head_dim=64, block_size=32, seed=2, **options)


def test_kernel_refuses_mixed_value_bits():
    from backend.kv_formats import make_format
    from kernels.alrkvd_attention import KERNEL_OPTIONS, AlrkvdLayer
    fmt = make_format("alrkvd", 1, 2, 64, torch.float16, "cpu", num_blocks=2, block_size=32,
                      **{**KERNEL_OPTIONS, "group": 64, "v_bits": 4, "v_low_tokens": 8})
    with pytest.raises(NotImplementedError):
        AlrkvdLayer.from_format(fmt, 0)


def test_caller_tickets_are_reset_for_the_next_call(monkeypatch):
    # the merge inside stage 1 counts finished splits on a ticket per (sequence, kv head); the engine passes one
    # buffer to every layer and step (CUDA graphs replay it), so each call must leave it at zero, and a second
    # call through it must merge exactly like the first. 37 splits of one 16-token tile each: more partials than
    # one merge step reads (32); the shorter sequences leave most splits without tiles.
    monkeypatch.setitem(alrkvd_mod._DEFAULT_STAGE1, "MIN_TOKENS_PER_SPLIT", 16)
    q, case = _random_case([37 * 16 + 5, 40, 1], num_kv_heads=1, gqa=4, head_dim=64, block_size=16, seed=5,
                           rank_max=16)
    _check(q, case, num_splits=37)
    case = to_device({k: v for k, v in case.items() if k != "fmt"}, DEVICE)
    q, scale = q.to(DEVICE), q.shape[-1] ** -0.5
    tickets = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    first = alrkvd_decode_attention(q, scale=scale, num_splits=37, tickets=tickets, **case)
    assert int(tickets.abs().sum()) == 0
    second = alrkvd_decode_attention(q, scale=scale, num_splits=37, tickets=tickets, **case)
    assert int(tickets.abs().sum()) == 0
    torch.testing.assert_close(second, first, atol=0, rtol=0)
    torch.testing.assert_close(alrkvd_decode_attention(q, scale=scale, num_splits=37, **case), first, atol=0, rtol=0)


@pytest.mark.parametrize("group", [1, 3, 4, 8])  # 8: Qwen3-30B-A3B's 32 query / 4 kv heads (dots of 1 to 8 rows)
@pytest.mark.parametrize("rank_per_head", [2.0, 8.0])
def test_gqa_and_ranks(group, rank_per_head):
    # odd lengths: window only, blocks + partial window, blocks exactly (the last one read from the window)
    q, case = _random_case([5, 2 * 32 + 17, 3 * 32], num_kv_heads=2, gqa=group, head_dim=64, block_size=32,
                           seed=group * 10 + int(rank_per_head), rank_per_head=rank_per_head)
    _check(q, case, num_splits=2)


@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_post_rope_keys(group):
    # key_frame=post_rope (the kernel's default is rotated): low-rank keys rebuilt and rotated per token in the loop
    q, case = _random_case([5, 2 * 32 + 17, 3 * 32], num_kv_heads=2, gqa=group, head_dim=64, block_size=32,
                           seed=group * 10 + 3, rank_per_head=8.0, key_frame="post_rope")
    assert not case["cache"].rotated_keys
    _check(q, case, num_splits=2)


def test_block_filled_this_step_is_read_from_the_window():
    # the cache compresses a block that a decode step fills after the attention (on a side stream), so the
    # kernel must read it from the window: whatever its compressed storage holds does not change the output
    q, case = _random_case([5, 2 * 32], num_kv_heads=2, gqa=3, head_dim=64, block_size=32, seed=11)
    scale = q.shape[-1] ** -0.5
    run = lambda: alrkvd_decode_attention(q.to(DEVICE), scale=scale, **to_device(
        {k: v for k, v in case.items() if k != "fmt"}, DEVICE))
    before = run()
    last = int(case["block_tables"][1, 1])
    for name in ("latent", "k_resid", "v_resid", "k_rscale", "v_rscale"):
        getattr(case["fmt"], name)[0, last].fill_(7)
    assert torch.equal(run(), before)
    _check(q, case, num_splits=2)


def test_window_in_several_tiles(monkeypatch):
    # the window's tile (WINDOW_N; 64 tokens in the 2-warp launch on the GPU) shorter than the window: a 32-token
    # block's window holding 1, 17 and 32 tokens, read 16 at a time
    for key in ("WINDOW_N", "WINDOW_N_MANY_PAIRS"):
        monkeypatch.setitem(alrkvd_mod._DEFAULT_STAGE1, key, 16)
    q, case = _random_case([32 + 1, 2 * 32 + 17, 3 * 32], num_kv_heads=2, gqa=3, head_dim=64, block_size=32, seed=13)
    _check(q, case, num_splits=2)


def test_a_window_across_slots_after_the_rows_closed_blocks():
    # a prompt chunk across blocks in one step: its rows read the blocks closed before it, compressed, and the
    # blocks it filled itself from the window, which runs on through the slots after the row's own. Sequence 1 (81
    # tokens, 2 blocks of 32 and 17) reads its first block compressed and 49 tokens from two consecutive slots;
    # a kernel that took the closed blocks from the length would read its second block compressed
    gen = torch.Generator().manual_seed(17)
    H, G, D, T = 2, 3, 64, 32
    kv = lambda n, **kw: random_kv((n, H, D), torch.float16, gen, **kw)  # noqa: E731
    k_blocks = [[], [kv(T), kv(T)], [kv(T) for _ in range(3)]]
    v_blocks = [[kv(T, channel_outliers=0) for _ in ks] for ks in k_blocks]
    windows = [(kv(5), kv(5, channel_outliers=0)), (kv(17), kv(17, channel_outliers=0)), (kv(0), kv(0))]
    case = build_alrkvd_case(k_blocks, v_blocks, [w[0] for w in windows], [w[1] for w in windows], gen,
                             block_size=T, num_slots=4)
    for name, block, window in (("window_k", k_blocks[1][1], windows[1][0]), ("window_v", v_blocks[1][1],
                                                                               windows[1][1])):
        grown = torch.cat([case[name], torch.zeros(2, T, H, D, dtype=torch.float16)])
        grown[4], grown[5, :17] = block, window
        case[name] = grown
    case["window_slots"] = case["window_slots"].clone()
    case["window_slots"][1] = 4
    case["closed"] = torch.tensor([0, 1, 2], dtype=torch.int32)
    q = random_kv((3, H * G, D), torch.float16, gen)
    _check(q, case, num_splits=2)


@pytest.mark.parametrize("group,T", [(3, 32), (8, 32), (8, 128)])
def test_a_prompt_chunk_in_tiles_of_rows_each_causal(group, T, monkeypatch):
    # a prompt chunk's 45 rows after 2 compressed blocks, its tokens in a run of two window slots, read in tiles of
    # up to 8 rows (one program reads each compressed tile for the tile's rows), beside a decode row of another
    # sequence and an unused tile: each row sees the tokens before its own length (a tile's rows differ), as the
    # reference reads them row by row; splits of a block, so that the rows' blocks take both splits
    monkeypatch.setitem(alrkvd_mod._TILES_STAGE1, "MIN_TOKENS_PER_SPLIT", T)
    gen = torch.Generator().manual_seed(19)
    H, D, n = 2, 64, 45  # blocks of T: 128, a block wider than the launch's tile of keys
    kv = lambda m, **kw: random_kv((m, H, D), torch.float16, gen, **kw)  # noqa: E731
    k_blocks = [[kv(T), kv(T)], [kv(T) for _ in range(3)]]
    v_blocks = [[kv(T, channel_outliers=0) for _ in ks] for ks in k_blocks]
    chunk_k, chunk_v = kv(n), kv(n, channel_outliers=0)
    case = build_alrkvd_case(k_blocks, v_blocks, [kv(0), kv(5)], [kv(0), kv(5, channel_outliers=0)], gen,
                             block_size=T, num_slots=3)
    for name, x in (("window_k", chunk_k), ("window_v", chunk_v)):  # the run: slots 3 and 4
        case[name] = torch.cat([case[name], torch.zeros(2, T, H, D, dtype=torch.float16)])
        case[name].view(-1, H, D)[3 * T:3 * T + n] = x
    rows = [0] * n + [1]
    case["block_tables"] = case["block_tables"][rows]
    case["seq_lens"] = torch.tensor([2 * T + i + 1 for i in range(n)] + [3 * T + 5], dtype=torch.int32)
    case["window_slots"] = torch.tensor([3] * n + [int(case["window_slots"][1])], dtype=torch.int32)
    case["closed"] = torch.tensor([2] * n + [3], dtype=torch.int32)
    starts = list(range(0, n, 8)) + [n, 0]
    case["tile_starts"] = torch.tensor(starts, dtype=torch.int32)
    case["tile_counts"] = torch.tensor([min(8, n - s) for s in starts[:-2]] + [1, 0], dtype=torch.int32)
    q = random_kv((n + 1, H * group, D), torch.float16, gen)
    _check(q, case, num_splits=2)


@pytest.mark.parametrize("options", [
    {"k_bits": 4, "v_bits": 2},
    {"k_bits": 8, "v_bits": 4},
    {"rank_min": 4, "rank_max": 16, "rank_per_head": 8.0},  # mixed ranks, every head >= 4
])
def test_format_options(options):
    q, case = _random_case([2 * 32 + 9, 40], num_kv_heads=2, gqa=3, head_dim=64, block_size=32, seed=7,
                           **options)
    _check(q, case, num_splits=3)


@pytest.mark.parametrize("key_frame,block_size", [("post_rope", 64), ("rotated", 64), ("rotated", 128)])
def test_head_dim_128_and_splits(key_frame, block_size):
    # Qwen3-like head: D = 128, group 4, blocks of 64 (the GPU preset) or 128 (a block a tile); more splits than
    # blocks (empty splits)
    q, case = _random_case([3 * block_size + 1], num_kv_heads=1, gqa=4, head_dim=128, block_size=block_size, seed=3,
                           rank_per_head=16.0, key_frame=key_frame)
    _check(q, case, num_splits=5)


@pytest.mark.skipif(not SMOLLM2_KV.exists(), reason="kernels/testdata/smollm2_kv.pt not present")
@pytest.mark.parametrize("layer,key_frame", [(3, "post_rope"), (20, "post_rope"), (3, "rotated"), (20, "rotated")])
def test_smollm2_keys_values(layer, key_frame):
    # real keys (before RoPE) and values of SmolLM2-135M: 3 kv heads, GQA 3, head_dim 64
    data = torch.load(SMOLLM2_KV)
    k, v, q_pre = data[f"k{layer}"], data[f"v{layer}"], data[f"q{layer}"]
    T = 32
    lengths = [k.shape[0] - 3, 2 * T + 11]  # the queries are of the last tokens: use prefixes
    gen = torch.Generator().manual_seed(layer)
    kb, vb, wk, wv = [], [], [], []
    for n in lengths:
        closed = n // T
        kb.append([k[i * T:(i + 1) * T] for i in range(closed)])
        vb.append([v[i * T:(i + 1) * T] for i in range(closed)])
        wk.append(k[closed * T:n])
        wv.append(v[closed * T:n])
    case = build_alrkvd_case(kb, vb, wk, wv, gen, rope_theta=data["rope_theta"], block_size=T,
                             rank_per_head=8.0, key_frame=key_frame)
    # the query of the token at position n - 1, rotated there
    q = torch.stack([rope_ref(q_pre[-4 + i][None], case["cos"][[n - 1]], case["sin"][[n - 1]])[0]
                     for i, n in enumerate(lengths)]).half()
    _check(q, case, num_splits=3)


@pytest.mark.parametrize("key_frame,options", [
    ("rotated", {"rank_per_head": 8.0}),
    ("post_rope", {"rank_per_head": 8.0}),
    ("rotated", {"k_bits": 8, "v_bits": 2, "rank_min": 4, "rank_max": 16, "rank_per_head": 8.0}),  # mixed ranks
])
def test_rebuilt_blocks_equal_the_reference(key_frame, options):
    # a sequence's closed blocks rebuilt as dense keys (rotated) and values in one launch (a prompt chunk's history)
    q, case = _random_case([3 * 32 + 5], num_kv_heads=2, gqa=1, head_dim=64, block_size=32, seed=17,
                           key_frame=key_frame, **options)
    case = to_device({k: v for k, v in case.items() if k != "fmt"}, DEVICE)
    blocks = case["block_tables"][0, :3]
    k, v = alrkvd_rebuild_blocks(case["cache"], blocks, case["cos"], case["sin"], torch.float32)
    k_ref, v_ref = alrkvd_decode_blocks_ref(case["cache"], blocks, case["cos"], case["sin"])
    assert k.shape == v.shape == (3 * 32, 2, 64)
    tol = 1e-4 if DEVICE == "cpu" else 1e-2  # the low-rank product: TF32 on CUDA (10-bit mantissa)
    torch.testing.assert_close(v, v_ref, atol=tol, rtol=tol)
    torch.testing.assert_close(k, k_ref, atol=tol, rtol=tol)
    half = alrkvd_rebuild_blocks(case["cache"], blocks[1:2], case["cos"], case["sin"], torch.float16)
    assert half[0].dtype == torch.float16 and half[0].shape == (32, 2, 64)
