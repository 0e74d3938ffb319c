"""The residual's rotation on random codes of one layer's 32 blocks: today's order (byte-table lookup, transpose,
scale, matmul) against the rotation's rows permuted to the lookup's order and the scale applied after (journal
2026-12-05 22a; not kept). Run from the repository root with PYTHONPATH=."""
import time, torch, sys
sys.path.insert(0, ".")
from kernels.codecs import byte_table, unpack_levels
from backend.kv_formats.codecs import gauss_codebook, rotation_matrix
torch.manual_seed(0)
n, T, H, D, bits = 32, 64, 3, 64, 4
per, nb = 8 // bits, D * bits // 8
codes = torch.randint(0, 256, (n, T, H, nb), dtype=torch.uint8)
s = torch.rand(n, T, H, 1)
table = byte_table(gauss_codebook(bits), bits)
rot = rotation_matrix(D, 0)
perm = torch.tensor([p * nb + b for b in range(nb) for p in range(per)])
rot_bm = rot.t()[perm].contiguous()
E = torch.empty(n, T, H, D)
def a():
    lv = unpack_levels(codes, table)
    x = (lv.reshape(n, T, H, 1, D) * s[..., None]).reshape(n, T, H, D)
    torch.matmul(x, rot.t(), out=E)
def b():
    lv = torch.nn.functional.embedding(codes.int(), table).view(n, T, H, D)
    torch.matmul(lv, rot_bm, out=E)
    E.mul_(s)
def c():
    lv = torch.nn.functional.embedding(codes.int(), table).view(n * T * H, D)
    torch.mm(lv, rot_bm, out=E.view(-1, D))
    E.mul_(s)
a(); ra = E.clone(); b(); rb = E.clone(); c(); rc = E.clone()
print("diff", (ra - rb).abs().max().item(), (ra - rc).abs().max().item())
for f in (a, b, c, a, b, c):
    t = time.perf_counter()
    for _ in range(200): f()
    print(f.__name__, (time.perf_counter() - t) / 200 * 1e3, "ms")
