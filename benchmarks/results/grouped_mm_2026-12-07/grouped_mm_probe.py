"""(Run at caf62c6, where kernels.fused_moe.grouped_mm_moe lived; reverted after, journal 2026-12-07 34a.)
Probe: the fused Triton MoE against torch._grouped_mm (CUTLASS grouped GEMM, no padding) at prefill sizes,
Qwen3-30B-A3B shape, uniform routing, CUDA-graph replays. Prints us per layer (both projections, everything)."""
import sys
import torch
import torch.nn.functional as F
sys.path.insert(0, ".")
from kernels import fused_moe as fm  # noqa: E402

dev = torch.device("cuda")
E, k, H, I = 128, 8, 2048, 768
g = torch.Generator(device=dev).manual_seed(0)
w13 = torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16, generator=g) * 0.02
w2 = torch.randn(E, H, I, device=dev, dtype=torch.bfloat16, generator=g) * 0.02


def graph_us(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        fn()
    gr.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(reps):
        gr.replay()
    t1.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(t1) / reps * 1000


def grouped(x, weights, ids):
    return fm.grouped_mm_moe(x, w13, w2, weights, ids)


rows = []
for T in [256, 1024, 2048, 4096, 8192]:
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16, generator=g)
    ids = torch.stack([torch.randperm(E, device=dev, generator=g)[:k] for _ in range(T)]).to(torch.int32)
    weights = torch.rand(T, k, device=dev, generator=g).softmax(-1).to(torch.bfloat16)
    ref = fm.fused_moe(x, w13, w2, weights, ids)
    out = grouped(x, weights, ids)
    err = (out.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
    t_fused = graph_us(lambda: fm.fused_moe(x, w13, w2, weights, ids))
    t_grouped = graph_us(lambda: grouped(x, weights, ids))
    flat = ids.flatten().long()
    offs = torch.cumsum(torch.bincount(flat, minlength=E), 0, dtype=torch.int32)
    xs = x[torch.argsort(flat, stable=True) // k]
    a2 = torch.randn(T * k, I, device=dev, dtype=torch.bfloat16, generator=g)
    t_gemm = graph_us(lambda: (torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs),
                               torch._grouped_mm(a2, w2.transpose(1, 2), offs=offs)))
    flops = 2 * T * k * (2 * I * H + H * I)
    rows.append((T, t_fused, t_grouped, t_gemm, flops / t_gemm / 1e6, err))
    print(rows[-1], flush=True)

print("| tokens | fused Triton us | grouped_mm pipeline us | its two GEMMs us | GEMM TFLOP/s | rel err |")
for T, a, b, c, tf, e in rows:
    print(f"| {T} | {a:.1f} | {b:.1f} ({a / b:.2f}x) | {c:.1f} | {tf:.0f} | {e:.1e} |")
