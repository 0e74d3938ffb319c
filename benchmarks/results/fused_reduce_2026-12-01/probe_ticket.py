"""Device probe: does a scalar tl.atomic_add run once per program (num_warps 2 and 4)?"""
import torch, triton, triton.language as tl


@triton.jit
def _k(P, Out, N: tl.constexpr):
    tl.debug_barrier()
    t = tl.atomic_add(P, 1, sem="acq_rel", scope="gpu")
    offs = tl.arange(0, N)
    tl.store(Out + tl.program_id(0) * N + offs, t + offs * 0)


for w in (1, 2, 4):
    p = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = torch.full((8, 64), -1, dtype=torch.int32, device="cuda")
    _k[(8,)](p, out, N=64, num_warps=w)
    torch.cuda.synchronize()
    print(f"warps {w}: counter {p.item()} tickets per program {out[:, 0].tolist()} uniform rows {bool((out == out[:, :1]).all())}")
