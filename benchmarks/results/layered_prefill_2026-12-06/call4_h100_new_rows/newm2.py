import sys, time, random
import torch, torch.nn.functional as F
dev = "cuda"
W = torch.randn(5120, 2048, device=dev, dtype=torch.bfloat16) / 45
def first_call(M):
    x = torch.randn(M, 2048, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize(); t = time.perf_counter()
    F.linear(x, W); torch.cuda.synchronize()
    a = time.perf_counter() - t; t = time.perf_counter()
    F.linear(x, W); torch.cuda.synchronize()
    return a * 1e3, (time.perf_counter() - t) * 1e3
for M in (64, 128, 256): first_call(M)
rng = random.Random(1)
for lib in ("cublas", "cublaslt"):
    torch.backends.cuda.preferred_blas_library(lib)
    for M in (64, 128): first_call(M)
    Ms = rng.sample(range(20, 2048), 10)
    r = [first_call(M) for M in Ms]
    print(f"{lib:9} new M first/second call ms: " + " ".join(f"{a:.2f}/{b:.2f}" for a, b in r), flush=True)
    r = [first_call(M) for M in Ms]
    print(f"{lib:9} same M again              : " + " ".join(f"{a:.2f}/{b:.2f}" for a, b in r), flush=True)
    Mp = [(-(-M // 64)) * 64 for M in rng.sample(range(20, 2048), 10)]
    r = [first_call(M) for M in Mp]
    print(f"{lib:9} new multiples of 64 {Mp}: " + " ".join(f"{a:.2f}/{b:.2f}" for a, b in r), flush=True)
torch.backends.cuda.preferred_blas_library("cublas")
x = torch.randn(300, 2048, device=dev, dtype=torch.bfloat16); W16 = W.half()
for M in rng.sample(range(20, 2048), 5):
    x = torch.randn(M, 2048, device=dev, dtype=torch.float16)
    torch.cuda.synchronize(); t = time.perf_counter(); F.linear(x, W16); torch.cuda.synchronize()
    print(f"fp16 new M {M}: {(time.perf_counter() - t) * 1e3:.2f} ms")
print(torch.version.cuda, torch.__version__)
