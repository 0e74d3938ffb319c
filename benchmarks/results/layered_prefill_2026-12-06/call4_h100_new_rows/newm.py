"""Is an eager step's extra cost per new row count M (first use), or per call? Host and GPU time of F.linear
(Qwen3-30B-A3B's qkv: 2048 -> 5120, bf16) and the fused MoE at new M values, then the same M values again."""
import sys, time, random
import torch, torch.nn.functional as F
sys.path.insert(0, ".")
from kernels.fused_moe import fused_moe
torch.manual_seed(0)
dev = "cuda"
W = torch.randn(5120, 2048, device=dev, dtype=torch.bfloat16) / 45
E, H, I, K = 128, 2048, 768, 8
w13 = torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) / 45
w2 = torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) / 28
def t_linear(M):
    x = torch.randn(M, 2048, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(6):
        F.linear(x, W)
    host = time.perf_counter() - t
    torch.cuda.synchronize()
    return host * 1e3 / 6, (time.perf_counter() - t) * 1e3 / 6
def t_moe(M):
    x = torch.randn(M, H, device=dev, dtype=torch.bfloat16)
    ids = torch.randint(0, E, (M, K), device=dev); w = torch.rand(M, K, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize(); t = time.perf_counter()
    fused_moe(x, w13, w2, w, ids)
    host = time.perf_counter() - t
    torch.cuda.synchronize()
    return host * 1e3, (time.perf_counter() - t) * 1e3
for M in (64, 128, 256, 512):  # warm the libraries and the Triton compiles of each M-tile size
    t_linear(M); t_moe(M)
rng = random.Random(0)
Ms = rng.sample(range(20, 2048), 12)
for name, fn in (("linear x6", t_linear), ("fused_moe", t_moe)):
    for rnd in ("new M", "same M again", "same M third"):
        rows = [fn(M) for M in Ms]
        print(f"{name:10} {rnd:13}: host ms per call " + " ".join(f"{h:.2f}" for h, _ in rows), flush=True)
        print(f"{name:10} {rnd:13}: wall ms per call " + " ".join(f"{w:.2f}" for _, w in rows), flush=True)
print("M:", Ms)
