"""One MoE layer of the SmolLM2 split (128 experts of 8 neurons, top 32, hidden 576), fp16 weights through FBGEMM:
all experts as one dense FFN with the routing as a mask against one matmul per routed expert (the grouped path in
fp32, as the CPU ran it), at 1 / 8 / 64 / 512 tokens. `PYTHONPATH=. python one_layer.py` from the repository root;
its output: one_layer.txt (2026-12-05, CPU)."""
import time, torch, torch.nn.functional as F
from kernels.moe_reference import grouped_experts
from backend.model import FP16Linear
torch.manual_seed(0)
E, I, H, k = 128, 8, 576, 32
w13 = torch.randn(E, 2 * I, H) * 0.05; w2 = torch.randn(E, H, I) * 0.05
lin = torch.nn.Linear(H, E * 2 * I, bias=False); lin.weight.data = w13.reshape(E * 2 * I, H); gu = FP16Linear(lin)
lin2 = torch.nn.Linear(E * I, H, bias=False); lin2.weight.data = w2.permute(1, 0, 2).reshape(H, E * I); dn = FP16Linear(lin2)
def dense(x, w, ids):
    T = x.shape[0]
    g, u = gu(x).view(T, E, 2, I).unbind(2)
    mask = x.new_zeros(T, E).scatter_(1, ids, w)
    return dn((F.silu(g) * u * mask[..., None]).view(T, E * I))
def grouped(x, w, ids):
    gate, up = w13.chunk(2, dim=1)
    return grouped_experts(x, w, ids, E, lambda e: (gate[e], up[e], w2[e]))
def t(fn, *a, n=20):
    fn(*a); s = time.perf_counter()
    for _ in range(n): fn(*a)
    return (time.perf_counter() - s) / n * 1e3
for T in (1, 8, 64, 512):
    x = torch.randn(T, H); logits = torch.randn(T, E)
    w, ids = torch.topk(logits.softmax(-1), k); w = w / w.sum(-1, keepdim=True)
    a, b = dense(x, w, ids), grouped(x, w, ids)
    print(T, "dense %.3f ms  grouped %.3f ms  max rel diff %.2e" % (t(dense, x, w, ids), t(grouped, x, w, ids), ((a - b).abs().max() / b.abs().max()).item()))
