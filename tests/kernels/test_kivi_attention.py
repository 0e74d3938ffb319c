"""kernels/kivi_attention.py against its PyTorch reference (CPU: TRITON_INTERPRET=1, small shapes).

Blocks are quantized by backend.kv_formats.KIVIFormat itself (random data with outliers, and real
SmolLM2-135M keys and values). Tolerance as for the ALR-KVD kernel: the kernel feeds tl.dot fp16
operands (each key and value tile rebuilt from its codes, scales and zeros, then rounded to fp16), so the
error that rounding keys and values to fp16 alone causes, e16, sets the budget:
    max|out - ref| <= 2 e16 + 2e-3 max(1, max|ref|)
"""
from kernels.testing import check_decode_kernel, random_kv, rope_tables, to_device, use_interpreter_without_gpu

DEVICE = use_interpreter_without_gpu()

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from backend.kv_formats import make_format  # noqa: E402
from kernels.alrkvd_attention import rope_ref  # noqa: E402
from kernels.kivi_attention import KiviLayer, kivi_decode_attention, kivi_decode_attention_ref  # noqa: E402

SMOLLM2_KV = Path(__file__).resolve().parents[2] / "kernels" / "testdata" / "smollm2_kv.pt"


def _case(k_seqs, v_seqs, bits, block_size, seed):
    """A one-layer KIVI cache holding sequences `k_seqs[i] [n_i, H, D]` (keys rotated), and the kernel's
    inputs: closed blocks at random block ids, the last 1..block_size tokens in a shuffled window slot."""
    gen = torch.Generator().manual_seed(seed)
    H, D = k_seqs[0].shape[1:]
    T = block_size
    closed = [max(k.shape[0] - 1, 0) // T for k in k_seqs]
    fmt = make_format(f"kivi{bits}", 1, H, D, torch.float16, "cpu", num_blocks=sum(closed) + 2, block_size=T)
    perm = torch.randperm(fmt.num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(k_seqs), max(closed) + 1, dtype=torch.int32)
    slots = torch.randperm(len(k_seqs) + 1, generator=gen)[:len(k_seqs)].int()
    window_k = torch.zeros(len(k_seqs) + 1, T, H, D, dtype=torch.float16)
    window_v = torch.zeros_like(window_k)
    for i, (k, v) in enumerate(zip(k_seqs, v_seqs)):
        for j in range(closed[i]):
            tables[i, j] = perm.pop()
            fmt.encode(0, int(tables[i, j]), k[j * T:(j + 1) * T], v[j * T:(j + 1) * T])
        rest = k.shape[0] - closed[i] * T
        window_k[slots[i], :rest] = k[closed[i] * T:]
        window_v[slots[i], :rest] = v[closed[i] * T:]
    return dict(cache=KiviLayer.from_format(fmt, 0), window_k=window_k, window_v=window_v, block_tables=tables,
                seq_lens=torch.tensor([k.shape[0] for k in k_seqs], dtype=torch.int32), window_slots=slots)


def _random_case(lengths, num_kv_heads, gqa, head_dim, bits, block_size=128, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ks = [random_kv((n, num_kv_heads, head_dim), torch.float16, gen) for n in lengths]
    vs = [random_kv((n, num_kv_heads, head_dim), torch.float16, gen, channel_outliers=0) for n in lengths]
    q = random_kv((len(lengths), num_kv_heads * gqa, head_dim), torch.float16, gen)
    return q, _case(ks, vs, bits, block_size, seed)


def _check(q, case, num_splits=None):
    case, q = to_device(case, DEVICE), q.to(DEVICE)
    out, stats = check_decode_kernel(kivi_decode_attention, kivi_decode_attention_ref, q, q.shape[-1] ** -0.5,
                                     num_splits, **case)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert stats["check_ok"], stats


def test_reference_matches_format_decode():
    # the reference dequantizes closed blocks as KIVIFormat.decode does
    q, case = _random_case([2 * 128 + 5], num_kv_heads=2, gqa=1, head_dim=64, bits=4)
    cache, blocks = case["cache"], case["block_tables"][0, :2]
    fmt = make_format("kivi4", 1, 2, 64, torch.float16, "cpu", num_blocks=cache.k_codes.shape[0], block_size=128)
    for name in ("k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero"):
        getattr(fmt, name)[0] = getattr(cache, name)
    k, v = fmt.decode(0, blocks.tolist())
    window = case["window_k"][case["window_slots"][0], :5]
    ref = kivi_decode_attention_ref(q, scale=0.125, **case)
    from kernels.paged_attention import attend_ref
    keys = torch.cat([k, window]).float()
    values = torch.cat([v, case["window_v"][case["window_slots"][0], :5]]).float()
    torch.testing.assert_close(ref[0].float(), attend_ref(q[0], keys, values, 0.125), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("fmt,opts", [("kivi3", {}), ("kivi2", {"head_dim": 64})])
def test_kernel_refuses_other_layouts(fmt, opts):
    f = make_format(fmt, 1, 2, opts.get("head_dim", 128), torch.float16, "cpu", num_blocks=2)
    with pytest.raises(NotImplementedError):  # 3 bits: two bit planes; 2 bits at head_dim 64: runs of 16
        KiviLayer.from_format(f, 0)


@pytest.mark.parametrize("bits,head_dim", [(2, 128), (4, 64), (4, 128)])
@pytest.mark.parametrize("gqa", [1, 3, 4, 8])
def test_matches_reference(bits, head_dim, gqa):
    # window only, blocks + partial window, blocks exactly (the last block read from the window), longer
    q, case = _random_case([5, 128 + 37, 2 * 128, 3 * 128 + 1], num_kv_heads=2, gqa=gqa, head_dim=head_dim,
                           bits=bits, seed=bits * 10 + gqa)
    _check(q, case, num_splits=2)


@pytest.mark.parametrize("layer", [3, 20])
def test_real_smollm2_kv(layer):
    # real keys and values of SmolLM2-135M (3 kv heads, GQA 3, head_dim 64), rotated as the cache keeps them
    data = torch.load(SMOLLM2_KV)
    k_pre, v, q_pre = data[f"k{layer}"], data[f"v{layer}"], data[f"q{layer}"]
    n = k_pre.shape[0]
    rope = rope_tables(64, n, data["rope_theta"])
    k = rope_ref(k_pre, rope.cos[:n], rope.sin[:n]).half()
    lengths = [n, 128 + 11]  # the queries are of the last tokens: the second sequence is a prefix
    case = _case([k[:m] for m in lengths], [v[:m].half() for m in lengths], 4, 128, seed=layer)
    q = torch.stack([rope_ref(q_pre[-1][None], rope.cos[[m - 1]], rope.sin[[m - 1]])[0] for m in lengths]).half()
    _check(q, case, num_splits=3)
