import torch, time
torch.set_num_threads(2)
d = torch.load("kernels/testdata/smollm2_kv.pt")
k, v = d["k20"].float(), d["v20"].float()   # [320, 3, 64]
T = 64
X = torch.cat([k[:T], v[:T]], 1).permute(1, 0, 2).contiguous()  # [6, T, 64]
def exact(X):
    G = (X.transpose(1, 2) @ X).double()
    w, U = torch.linalg.eigh(G)
    return w.flip(-1).clamp_min(0), U.flip(-1).transpose(1, 2)
def subspace(X, k, iters, seed=0):
    G = (X.transpose(1, 2) @ X).double()
    D = G.shape[-1]
    Q = torch.randn(D, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).expand(G.shape[0], D, k)
    for _ in range(iters):
        Q, _ = torch.linalg.qr(G @ Q)
    w, U = torch.linalg.eigh(Q.transpose(1, 2) @ G @ Q)
    return w.flip(-1).clamp_min(0), (Q @ U.flip(-1)).transpose(1, 2)
we, Ve = exact(X)
for k, it in [(16, 2), (16, 3), (16, 4), (24, 3), (40, 3)]:
    ws, Vs = subspace(X, k, it)
    r = 8
    # energy captured by the top-r subspace, relative to exact
    G = (X.transpose(1, 2) @ X).double()
    cap_e = torch.einsum("nrd,nde,nre->n", Ve[:, :r], G, Ve[:, :r])
    cap_s = torch.einsum("nrd,nde,nre->n", Vs[:, :r], G, Vs[:, :r])
    print(k, it, "eigval rel err top8", ((ws[:, :r] - we[:, :r]).abs() / we[:, :r]).max().item(), "captured ratio min", (cap_s / cap_e).min().item())
for D, N, k, it in [(64, 6, 16, 3), (128, 8, 24, 3), (128, 8, 72, 3), (128, 512, 24, 3)]:
    Xr = torch.randn(N, 128, D)
    t = time.perf_counter(); exact(Xr); te = time.perf_counter() - t
    t = time.perf_counter(); subspace(Xr, k, it); ts = time.perf_counter() - t
    print(f"D={D} N={N} k={k}: exact {te/N*1e3:.3f} ms/matrix, subspace {ts/N*1e3:.3f} ms/matrix, {te/ts:.1f}x")
