"""8 streams x 4 requests of 32 tokens against `alrkvd-serve --models smollm2_moe` (CPU), the server running with
probe.patch applied to model_repository/smollm2/1/triton_metrics.py (journal 2026-12-07 41c)."""
import sys, time, threading
sys.path.insert(0, ".")  # run from the repository root, the server up
from client.api import complete
def worker(i, out):
    for k in range(4):
        t0 = time.perf_counter()
        c = complete(f"Tell me a short story about a {['cat','dog','fox','owl','bee','elk','yak','ant'][i]} number {k}.", max_tokens=32, temperature=0, ignore_eos=True)
        out.append(time.perf_counter() - t0)
out = []
ts = [threading.Thread(target=worker, args=(i, out)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print("requests", len(out))
