"""float64 eigh of 180 Gram matrices of 64 x 64 on the CPU: batched, split over two threads, and in float32
(journal 2026-12-05 22b)."""
import time, torch, threading
torch.manual_seed(0)
X = torch.randn(180, 64, 64, dtype=torch.float64); G = X @ X.transpose(1, 2)
def t(f, n=10):
    f(); s = time.perf_counter()
    for _ in range(n): f()
    return round((time.perf_counter() - s) / n * 1e3, 2)
print("batched", t(lambda: torch.linalg.eigh(G)))
def two():
    out = [None, None]
    def run(i): out[i] = torch.linalg.eigh(G[i * 90:(i + 1) * 90])
    th = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    [x.start() for x in th]; [x.join() for x in th]
    return out
print("two threads", t(two))
w1, v1 = torch.linalg.eigh(G); o = two()
print(torch.equal(w1, torch.cat([o[0][0], o[1][0]])), torch.equal(v1, torch.cat([o[0][1], o[1][1]])))
print("float32", t(lambda: torch.linalg.eigh(G.float())))
