"""ALR-KVD caches for the kernel tests, built through the format itself (backend.kv_formats): test code, not a
kernel helper (kernels/ never imports the engine). Imported by tests/kernels/test_*.py as `alrkvd_cases`
(pytest puts tests/ on sys.path).
"""
from __future__ import annotations

import torch

from kernels.testing import rope_tables


def build_alrkvd_case(k_blocks, v_blocks, window_k, window_v, generator: torch.Generator,
                      rope_theta: float = 10000.0, num_slots: int | None = None, **options):
    """A one-layer ALR-KVD cache (backend.kv_formats) holding given sequences, and the kernel's inputs.

    Options: the layout the kernel reads (`KERNEL_OPTIONS`, group = head_dim) unless given.
    k_blocks/v_blocks: per sequence a list of closed blocks `[T, H, D]` (keys before RoPE);
    window_k/window_v: per sequence its window rows `[n < T, H, D]` (for n = 0 the window slot holds a
    copy of the last block, which the kernel reads from there, as the cache leaves it). Blocks are placed at random
    block ids, windows at shuffled slots. Returns a dict with `fmt` and the kwargs of
    `alrkvd_decode_attention` except `q` and `scale`."""
    # imported here: a kernel module must be imported after use_interpreter_without_gpu()
    from backend.kv_formats import make_format
    from kernels.alrkvd_attention import KERNEL_OPTIONS, AlrkvdLayer

    T = options.pop("block_size")
    H, D = window_k[0].shape[-2:]
    dtype = window_k[0].dtype
    batch = len(k_blocks)
    num_blocks = sum(len(s) for s in k_blocks) + 2
    options = {**KERNEL_OPTIONS, "group": D, **options}  # the layout the kernel reads, the exact basis
    fmt = make_format("alrkvd", 1, H, D, dtype, "cpu", num_blocks=num_blocks, block_size=T, **options)
    rotary = rope_tables(D, max(len(s) for s in k_blocks) * T + T, rope_theta)
    fmt.set_rotary(rotary)
    perm = torch.randperm(num_blocks, generator=generator).tolist()
    seq_lens, tables = [], []
    for ks, vs, wk in zip(k_blocks, v_blocks, window_k):
        ids = [perm.pop() for _ in ks]
        for i, (bid, k, v) in enumerate(zip(ids, ks, vs)):
            fmt.encode(0, bid, k, v, start_pos=i * T)
        tables.append(ids)
        seq_lens.append(len(ks) * T + wk.shape[0])
    width = max(1, max(len(t) for t in tables) + 1)
    block_tables = torch.zeros(batch, width, dtype=torch.int32)
    for b, ids in enumerate(tables):
        block_tables[b, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
    num_slots = num_slots or batch + 1
    slots = torch.randperm(num_slots, generator=generator)[:batch].int()
    wk_all = torch.zeros(num_slots, T, H, D, dtype=dtype)
    wv_all = torch.zeros_like(wk_all)
    for b, (wk, wv) in enumerate(zip(window_k, window_v)):
        if wk.shape[0] == 0 and k_blocks[b]:  # the window holds the last 1..T tokens: a full last block too
            wk, wv = k_blocks[b][-1], v_blocks[b][-1]
        wk_all[slots[b], : wk.shape[0]] = wk
        wv_all[slots[b], : wv.shape[0]] = wv
    return {
        "fmt": fmt, "cache": AlrkvdLayer.from_format(fmt, 0), "window_k": wk_all, "window_v": wv_all,
        "block_tables": block_tables, "seq_lens": torch.tensor(seq_lens, dtype=torch.int32),
        "window_slots": slots, "cos": rotary.cos, "sin": rotary.sin,
    }
