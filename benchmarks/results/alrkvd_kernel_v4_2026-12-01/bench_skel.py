"""Device prototype timing: residual-only skeleton kernels (two orientations) against SDPA and the repo's
KIVI-2 and ALR-KVD r16 kernels, same run. python reports/proto/bench_skel.py OUT"""
import json, math, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3])); sys.path.insert(0, str(Path(__file__).parent))
import torch, triton
from benchmarks.devices import copy_bandwidth
from benchmarks import bench_attention as ba
from kernels.paged_attention import decode_reduce, LOG2E
import skeleton

dev = "cuda"
H, G, D = 8, 4, 128
out_dir = Path(sys.argv[1]); out_dir.mkdir(parents=True, exist_ok=True)
rows = []
copy_bw = copy_bandwidth(dev)
print(f"copy {copy_bw/1e9:.0f} GB/s", flush=True)


def skel_data(B, L):
    g = lambda *s: torch.randint(0, 256, s, dtype=torch.uint8, device=dev)
    f = lambda v, *s: torch.full(s, v, dtype=torch.float16, device=dev) * (1 + 0.1 * torch.rand(s, device=dev, dtype=torch.float16))
    return dict(KC=g(B, H, L, D // 4), KS=f(0.1, B, H, L), KZ=f(-0.15, B, H, L), VC=g(B, H, L, D // 4),
                VS=f(0.1, B, H, L), VZ=f(-0.15, B, H, L))


def skel_ref(q, d, scale):
    def dec(c, s, z):
        c = c.long(); codes = torch.cat([(c >> (2 * r)) & 3 for r in range(4)], -1).float()
        return codes * s.float()[..., None] + z.float()[..., None]
    k, v = dec(d["KC"], d["KS"], d["KZ"]), dec(d["VC"], d["VS"], d["VZ"])  # [B, H, L, D]
    qq = q.float().view(q.shape[0], H, G, D)
    p = torch.softmax(torch.einsum("bhgd,bhld->bhgl", qq, k) * scale, -1)
    return torch.einsum("bhgl,bhld->bhgd", p, v).reshape(q.shape)


def skel_call(fn, q, d, B, L, cfg, splits):
    mid_o = torch.empty(B, H * G, splits, D, dtype=torch.float32, device=dev)
    mid_lse = torch.empty(B, H * G, splits, dtype=torch.float32, device=dev)
    out = torch.empty(B, H * G, D, dtype=torch.float16, device=dev)
    def call():
        k = fn[(B, H, splits)](q, d["KC"], d["KS"], d["KZ"], d["VC"], d["VS"], d["VZ"], mid_o, mid_lse, D ** -0.5 * LOG2E, L,
                           splits, H=H, G=G, BLOCK_G=16, D=D, BLOCK_N=cfg["BLOCK_N"], num_warps=cfg["num_warps"],
                           num_stages=cfg["num_stages"])
        compiled[fn.__name__ if hasattr(fn, "__name__") else str(fn)] = k
        return decode_reduce(mid_o, mid_lse, out)
    return call


def rec(B, L, method, sec, nbytes, **extra):
    r = dict(B=B, L=L, method=method, us=sec * 1e6, GBps=nbytes / sec / 1e9, frac_copy=nbytes / sec / copy_bw, **extra)
    rows.append(r)
    sd = next((x["us"] for x in rows if x["B"] == B and x["L"] == L and x["method"] == "sdpa"), float("nan"))
    print(f"{B:>3} {L:>7} {method:<34} {r['us']:9.1f} us {r['GBps']:7.0f} GB/s {100*r['frac_copy']:5.1f}%  {sd/r['us']:5.2f}x sdpa {extra}", flush=True)


asm_stats = {}
compiled = {}
for B, L in [(8, 32768), (1, 4096), (32, 32768), (8, 131072)]:
    # SDPA baseline
    kv_bytes = 2 * B * H * L * D * 2
    n = ba.num_copies(kv_bytes, dev)
    data = [(torch.randn(B, H * G, 1, D, device=dev, dtype=torch.float16), torch.randn(B, H, L, D, device=dev, dtype=torch.float16),
             torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(n)]
    rec(B, L, "sdpa", ba.time_calls([ba.sdpa_call(*x) for x in data], dev), kv_bytes)
    del data; torch.cuda.empty_cache()
    # skeletons
    nbytes = B * H * L * (2 * D // 4 + 8)
    n = ba.num_copies(nbytes, dev)
    sk = [skel_data(B, L) for _ in range(n)]
    q = torch.randn(B, H * G, D, device=dev, dtype=torch.float16)
    want_splits = triton.cdiv(4 * 132, B * H)
    for fn_name in ("skel_qk", "skel_swap", "skel_swap2"):
        for cfg in (dict(BLOCK_N=64, num_warps=4, num_stages=2), dict(BLOCK_N=128, num_warps=4, num_stages=2),
                    dict(BLOCK_N=64, num_warps=4, num_stages=3), dict(BLOCK_N=128, num_warps=8, num_stages=2)):
            for min_tok in (128, 512):
                splits = max(1, min(64, L // min_tok, want_splits))
                while L % (splits * cfg["BLOCK_N"]): splits -= 1
                name = f"{fn_name} n{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg['num_stages']} sp{splits}"
                try:
                    fn = getattr(skeleton, fn_name)
                    calls = [skel_call(fn, q, d, B, L, cfg, splits) for d in sk]
                    extra = {}
                    if B * L <= 8192:
                        ref = skel_ref(q, sk[0], D ** -0.5)
                        extra["max_err"] = (calls[0]().float() - ref).abs().max().item()
                    rec(B, L, name, ba.time_calls(calls, dev), nbytes, **extra)
                except Exception as e:
                    print(name, "FAILED", type(e).__name__, str(e)[:300], flush=True)
                    rows.append(dict(B=B, L=L, method=name, error=str(e)[:300]))
    # asm stats once
    if not asm_stats:
        try:
            for fn_name, k in compiled.items():
                t = k.asm.get("ttgir", ""); p = k.asm.get("ptx", "")
                asm_stats[fn_name] = dict(n_regs=k.n_regs, spills=k.n_spills, wgmma=p.count("wgmma.mma_async"),
                                          mma_sync=p.count("mma.sync"), local_alloc=t.count("local_alloc"))
                (out_dir / f"{fn_name}.ttgir").write_text(t)
        except Exception as e:
            print("asm stats failed", e)
        print(json.dumps(asm_stats), flush=True)
    del sk; torch.cuda.empty_cache()
    # the repo's kernels, same run
    for name in ("kivi2", "alrkvd-r16"):
        try:
            if name == "kivi2":
                make = lambda: ba.make_kivi(B, L, H, D, 128, 2, dev, None); kern = ba.kivi_decode_attention
            else:
                make = lambda: ba.make_alrkvd(B, L, H, D, 128, *ba.VARIANTS[name], dev, None); kern = ba.alrkvd_decode_attention
            first, nb = make()
            layers = [first] + [make()[0] for _ in range(ba.num_copies(nb, dev) - 1)]
            rec(B, L, name, ba.time_calls([lambda kw=kw: kern(q, scale=D ** -0.5, **kw) for kw in layers], dev), nb)
            del layers, first
        except Exception as e:
            print(name, "FAILED", type(e).__name__, str(e)[:300], flush=True)
        torch.cuda.empty_cache()
    (out_dir / "rows.json").write_text(json.dumps(dict(copy_bw=copy_bw, torch=torch.__version__, triton=triton.__version__,
                                                       device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                       rows=rows, asm=asm_stats), indent=1))
