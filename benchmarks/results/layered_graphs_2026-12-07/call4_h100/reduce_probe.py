# Ran at f1719f9 (the blocked stage 2, reverted in 67743ae) with .probe/old_paged_attention.py a copy of
# kernels/paged_attention.py at cbf3825 (= main after the revert): `git show cbf3825:kernels/paged_attention.py`.
"""Stage 2 (decode_reduce) alone: HEAD's one program a (row, head) against the blocked merge, at the partial
shapes of a 2,048-token chunk's tiles launch (8 splits, the first one or two keyed) and of decode rows."""
import sys
import torch
import triton
sys.path.insert(0, ".probe")
import old_paged_attention as old
from kernels import paged_attention as pa

def bench(fn, n=50):
    g = torch.cuda.CUDAGraph()
    fn(); torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    g.replay(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    times = []
    for _ in range(n):
        e0.record(); g.replay(); e1.record(); e1.synchronize(); times.append(e0.elapsed_time(e1) * 100)  # us each
    times.sort()
    return times[len(times) // 2]

rows = []
for T, S, keyed in [(2048, 8, 2), (2056, 8, 2), (4096, 4, 4), (32, 16, 16), (8, 64, 64)]:
    mid_o = torch.randn(T, 32, S, 128, device="cuda")
    mid_lse = torch.randn(T, 32, S, device="cuda")
    mid_lse[:, :, keyed:] = float("-inf")
    out = torch.empty(T, 32, 128, device="cuda", dtype=torch.float16)
    ref = old.decode_reduce(mid_o, mid_lse, out.clone())
    t_old = bench(lambda: old.decode_reduce(mid_o, mid_lse, out))
    res = [f"T={T} S={S} keyed={keyed}: old {t_old:.1f} us"]
    for bh, w in [(4, 1), (8, 2), (16, 4), (16, 8), (2, 1)]:
        pa.REDUCE_HEADS, pa.REDUCE_WARPS = bh, w
        new = pa.decode_reduce(mid_o, mid_lse, torch.empty_like(out))
        err = (new.float() - ref.float()).abs().max().item()
        res.append(f"({bh},{w}) {bench(lambda: pa.decode_reduce(mid_o, mid_lse, out)):.1f} us err {err:.1e}")
    print(" | ".join(res), flush=True)
