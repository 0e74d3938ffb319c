"""Device sweep of skel_alr launch/code variants at B=8 L=32k and B=1 L=4k."""
import json, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3])); sys.path.insert(0, str(Path(__file__).parent))
import torch, triton
from benchmarks.devices import copy_bandwidth
from benchmarks import bench_attention as ba
from kernels.paged_attention import decode_reduce, LOG2E
import skeleton
from alr_data import H, G, D, R, T, alr_data, alr_ref, alr_args
dev = "cuda"
out_dir = Path(sys.argv[1]); out_dir.mkdir(parents=True, exist_ok=True)
rows = []
copy_bw = copy_bandwidth(dev)
VARIANTS = eval(sys.argv[2])  # (kernel, bn, regs, f16, swapk, warps, stages, maxnreg)
for B, L in [(8, 32768), (1, 4096), (32, 32768)]:
    alr_bytes = B * H * L * (2 * D // 4 + 8) + B * H * L * 2 * R + B * H * (L // T) * 2 * R * (D + 6)
    ds = [alr_data(B, L, dev) for _ in range(ba.num_copies(alr_bytes, dev))]
    q = torch.randn(B, H * G, D, device=dev, dtype=torch.float16)
    kv_bytes = 2 * B * H * L * D * 2
    data = [(q[:, :, None], torch.randn(B, H, L, D, device=dev, dtype=torch.float16), torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(ba.num_copies(kv_bytes, dev))]
    sdpa = ba.time_calls([ba.sdpa_call(*x) for x in data], dev) * 1e6
    del data
    print(f"B={B} L={L} sdpa {sdpa:.1f} us", flush=True)
    splits = max(1, min(64, L // 128, triton.cdiv(4 * 132, B * H)))
    for v in VARIANTS:
        kern, bn, regs, f16, sw, w, st, mr = v
        sp = splits
        while L % (sp * 128): sp -= 1
        mid_o = torch.empty(B, H * G, sp, D, dtype=torch.float32, device=dev)
        mid_lse = torch.empty(B, H * G, sp, dtype=torch.float32, device=dev)
        out = torch.empty(B, H * G, D, dtype=torch.float16, device=dev)
        opts = dict(num_warps=w, num_stages=st, **({"maxnreg": mr} if mr else {}))
        info = {}
        def mk(d):
            def call():
                extra = dict(ROPE_REGS=regs, LR_KEYS=True, F16=f16, SWAPK=sw) if kern == "skel_alr" else {}
                k = getattr(skeleton, kern)[(B, H, sp)](q, d["KC"], d["KS"], d["KZ"], d["VC"], d["VS"], d["VZ"], mid_o, mid_lse, D ** -0.5 * LOG2E, L, sp,
                                                  *alr_args(d), H=H, G=G, BLOCK_G=16, D=D, BLOCK_N=bn, R=R, T=T, **extra, **opts)
                info["regs"], info["spills"] = k.n_regs, k.n_spills
                return decode_reduce(mid_o, mid_lse, out)
            return call
        try:
            calls = [mk(d) for d in ds]
            err = (calls[0]().float() - alr_ref(q, ds[0], D ** -0.5)).abs().max().item() if B * L <= 4096 else None
            us = ba.time_calls(calls, dev) * 1e6
            r = dict(B=B, L=L, variant=v, us=us, sdpa_us=sdpa, frac_copy=alr_bytes / us / 1e-6 / copy_bw, err=err, **info)
            print(f"{str(v):<52} {us:8.1f} us  {sdpa/us:5.2f}x sdpa  {100*r['frac_copy']:5.1f}% copy  regs {info['regs']} spills {info['spills']} err {err}", flush=True)
            rows.append(r)
        except Exception as e:
            print(v, "FAILED", type(e).__name__, str(e)[:200], flush=True)
    del ds; torch.cuda.empty_cache()
(out_dir / "sweep.json").write_text(json.dumps(dict(copy_bw=copy_bw, triton=triton.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows=rows), indent=1))
