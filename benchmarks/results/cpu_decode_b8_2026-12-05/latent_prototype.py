"""A PyTorch prototype of attention on the compressed form (rotated key frame) on random data of the CPU server's
shapes at 8 x 4 blocks: residual scores against the query rotated once, the low-rank part through the query's
projection on each block's basis (journal 2026-12-05 22a; not kept). Run from the repository root with PYTHONPATH=."""
import time, torch, sys
sys.path.insert(0, ".")
from kernels.codecs import byte_table
from backend.kv_formats.codecs import gauss_codebook
torch.manual_seed(0)
B, W, T, H, G, D, bits, R = 8, 4, 64, 3, 3, 64, 4, 8
n = B * W
nb = D * bits // 8
kc = torch.randint(0, 256, (n, T, H, nb), dtype=torch.uint8); vc = kc.clone()
ks = torch.rand(n, T, H, 1); vs = torch.rand(n, T, H, 1)
table = byte_table(gauss_codebook(bits), bits)
lat = torch.rand(n, T, R); Bk = torch.rand(n, R, H * D); Bv = torch.rand(n, R, H * D)
q = torch.rand(B, H, G, D)
rot = torch.linalg.qr(torch.randn(D, D))[0]
def latent_attn():
    # residuals in the rotated frame, byte-major order: the query permuted/rotated once instead
    kl = torch.nn.functional.embedding(kc.int(), table).view(n, T, H, D).mul_(ks)       # [n, T, H, D]
    vl = torch.nn.functional.embedding(vc.int(), table).view(n, T, H, D).mul_(vs)
    K = kl.view(B, W * T, H, D).permute(0, 2, 1, 3)                                    # [B, H, WT, D] (strided)
    V = vl.view(B, W * T, H, D).permute(0, 2, 1, 3)
    qr = q @ rot                                                                        # [B, H, G, D]
    s = qr @ K.transpose(-1, -2)                                                         # [B, H, G, WT]
    # low rank: q . (L B) = (q B^T) . L per block
    qb = torch.einsum("bhgd,bwrhd->bwhgr", q, Bk.view(B, W, R, H, D))                 # [B, W, H, G, R]
    s = s + torch.einsum("bwhgr,bwtr->bhgwt", qb, lat.view(B, W, T, R)).reshape(B, H, G, W * T)
    p = torch.softmax(s * D ** -0.5, -1)
    o = (p @ V) @ rot.t()                                                               # [B, H, G, D]
    pl = torch.einsum("bhgwt,bwtr->bhgwr", p.view(B, H, G, W, T), lat.view(B, W, T, R))
    o = o + torch.einsum("bhgwr,bwrhd->bhgd", pl, Bv.view(B, W, R, H, D))
    return o
for _ in range(3): latent_attn()
t = time.perf_counter()
for _ in range(50): latent_attn()
print("latent attention, one layer:", (time.perf_counter() - t) / 50 * 1e3, "ms")
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(10): latent_attn()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
