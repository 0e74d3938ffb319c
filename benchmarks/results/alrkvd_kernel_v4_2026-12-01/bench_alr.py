"""Device prototype: skel_alr (ALR-KVD math in the skeleton's structure) vs SDPA, skel_qk and the repo's kernel."""
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
rows, compiled = [], {}
copy_bw = copy_bandwidth(dev)
print(f"copy {copy_bw/1e9:.0f} GB/s", flush=True)


def call_of(fn, q, d, B, L, splits, cfg, **consts):
    mid_o = torch.empty(B, H * G, splits, D, dtype=torch.float32, device=dev)
    mid_lse = torch.empty(B, H * G, splits, dtype=torch.float32, device=dev)
    out = torch.empty(B, H * G, D, dtype=torch.float16, device=dev)
    extra = alr_args(d) if fn is skeleton.skel_alr else []
    def call():
        k = fn[(B, H, splits)](q, d["KC"], d["KS"], d["KZ"], d["VC"], d["VS"], d["VZ"], mid_o, mid_lse, D ** -0.5 * LOG2E, L, splits,
                               *extra, H=H, G=G, BLOCK_G=16, D=D, **consts, **cfg)
        compiled[str(consts) + str(cfg)] = k
        return decode_reduce(mid_o, mid_lse, out)
    return call


def rec(B, L, method, sec, nbytes, **extra):
    r = dict(B=B, L=L, method=method, us=sec * 1e6, GBps=nbytes / sec / 1e9, frac_copy=nbytes / sec / copy_bw, **extra)
    rows.append(r)
    sd = next((x["us"] for x in rows if x["B"] == B and x["L"] == L and x["method"] == "sdpa"), float("nan"))
    print(f"{B:>3} {L:>7} {method:<44} {r['us']:9.1f} us {r['GBps']:7.0f} GB/s {100*r['frac_copy']:5.1f}%  {sd/r['us']:5.2f}x sdpa {extra}", flush=True)


for B, L in [(8, 32768), (1, 4096), (32, 32768)]:
    kv_bytes = 2 * B * H * L * D * 2
    data = [(torch.randn(B, H * G, 1, D, device=dev, dtype=torch.float16), torch.randn(B, H, L, D, device=dev, dtype=torch.float16),
             torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(ba.num_copies(kv_bytes, dev))]
    rec(B, L, "sdpa", ba.time_calls([ba.sdpa_call(*x) for x in data], dev), kv_bytes)
    del data; torch.cuda.empty_cache()
    skel_bytes = B * H * L * (2 * D // 4 + 8)
    alr_bytes = skel_bytes + B * H * L * 2 * R + B * H * (L // T) * 2 * R * (D + 2 + 4)
    n = ba.num_copies(alr_bytes, dev)
    ds = [alr_data(B, L, dev) for _ in range(n)]
    q = torch.randn(B, H * G, D, device=dev, dtype=torch.float16)
    for min_tok in (256, 128):
        splits = max(1, min(64, L // min_tok, triton.cdiv(4 * 132, B * H)))
        while L % (splits * 128): splits -= 1
        cfg = dict(num_warps=4, num_stages=2)
        rec(B, L, f"skel_qk n128 w4 s2 sp{splits}", ba.time_calls([call_of(skeleton.skel_qk, q, d, B, L, splits, cfg, BLOCK_N=128) for d in ds], dev), skel_bytes)
        for bn, w, st in ((64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 2)):
            for regs, lr in ((True, True), (False, True), (False, False)):
                if bn == 128 and regs: continue
                name = f"skel_alr n{bn} w{w} s{st} sp{splits} ropeRegs={int(regs)} lrKeys={int(lr)}"
                try:
                    cfg = dict(num_warps=w, num_stages=st)
                    calls = [call_of(skeleton.skel_alr, q, d, B, L, splits, cfg, BLOCK_N=bn, R=R, T=T, ROPE_REGS=regs, LR_KEYS=lr) for d in ds]
                    extra = {}
                    if B * L <= 4096:
                        extra["max_err"] = (calls[0]().float() - alr_ref(q, ds[0], D ** -0.5, lr)).abs().max().item()
                    rec(B, L, name, ba.time_calls(calls, dev), alr_bytes if lr else alr_bytes - B * H * L * R - B * H * (L // T) * R * (D + 6), **extra)
                except Exception as e:
                    print(name, "FAILED", type(e).__name__, str(e)[:300], flush=True)
        if B * L > 100000: break  # one split count for the big shapes
    del ds; torch.cuda.empty_cache()
    first, nb = ba.make_alrkvd(B, L, H, D, 128, *ba.VARIANTS["alrkvd-r16"], dev, None)
    layers = [first] + [ba.make_alrkvd(B, L, H, D, 128, *ba.VARIANTS["alrkvd-r16"], dev, None)[0] for _ in range(ba.num_copies(nb, dev) - 1)]
    rec(B, L, "alrkvd-r16 (repo kernel)", ba.time_calls([lambda kw=kw: ba.alrkvd_decode_attention(q, scale=D ** -0.5, **kw) for kw in layers], dev), nb)
    del layers, first; torch.cuda.empty_cache()
stats = {k: dict(n_regs=c.n_regs, spills=c.n_spills) for k, c in compiled.items()}
print(json.dumps(stats, indent=0))
(out_dir / "rows.json").write_text(json.dumps(dict(copy_bw=copy_bw, torch=torch.__version__, triton=triton.__version__,
                                                   device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                   rows=rows, regs=stats), indent=1))
