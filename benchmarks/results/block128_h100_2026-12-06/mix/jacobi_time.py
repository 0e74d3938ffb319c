# time kernels/jacobi_eigh.py (branch exp/jacobi-eigh) against torch.linalg.eigh on the compression's Ritz matrices
import torch
import sys; sys.path.insert(0, ".probe")
from jacobi_eigh import jacobi_eigh  # a copy of exp/jacobi-eigh:kernels/jacobi_eigh.py
torch.manual_seed(0)
for B in (1536, 4224, 12288):
    X = torch.randn(B, 128, 24, device="cuda", dtype=torch.float64) * torch.logspace(0, -3, 24, device="cuda", dtype=torch.float64)
    M = X.transpose(1, 2) @ X
    for name, fn in (("eigh f64", lambda: torch.linalg.eigh(M)), ("eigh f32", lambda: torch.linalg.eigh(M.float())),
                     *((f"jacobi {s}", (lambda s=s: jacobi_eigh(M, sweeps=s))) for s in (3, 4, 5))):
        fn(); torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(10):
            w, V = fn()
        e1.record(); torch.cuda.synchronize()
        rec = ((V.double() @ torch.diag_embed(w.double()) @ V.double().transpose(1, 2) - M).abs().amax() / M.abs().amax()).item()
        print(f"B={B} {name}: {e0.elapsed_time(e1) / 10:.3f} ms, reconstruction {rec:.1e}")
