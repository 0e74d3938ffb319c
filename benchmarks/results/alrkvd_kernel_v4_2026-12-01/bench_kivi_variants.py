"""Device A/B: the KIVI kernel before (kivi_old), with folded scales (kivi_fold32, the repo's new version) and two
groups per iteration (kivi_fold64), several launch configs; SDPA in the same run."""
import json, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3])); sys.path.insert(0, str(Path(__file__).parent))
import torch, triton
from benchmarks.devices import copy_bandwidth
from benchmarks import bench_attention as ba
from kernels.testing import check_decode_kernel
import kivi_old, kivi_f16, kivi_f16_64
dev = "cuda"
H, G, D = 8, 4, 128
out_dir = Path(sys.argv[1]); out_dir.mkdir(parents=True, exist_ok=True)
rows = []
copy_bw = copy_bandwidth(dev)
print(f"copy {copy_bw/1e9:.0f} GB/s")
CFGS = [dict(num_warps=4, num_stages=2, MIN_TOKENS_PER_SPLIT=128), dict(num_warps=2, num_stages=2, MIN_TOKENS_PER_SPLIT=128)]
for B, L in [(8, 32768), (1, 4096), (32, 32768), (1, 32768)]:
    kv_bytes = 2 * B * H * L * D * 2
    data = [(torch.randn(B, H * G, 1, D, device=dev, dtype=torch.float16), torch.randn(B, H, L, D, device=dev, dtype=torch.float16),
             torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(ba.num_copies(kv_bytes, dev))]
    sdpa = ba.time_calls([ba.sdpa_call(*x) for x in data], dev) * 1e6
    del data; torch.cuda.empty_cache()
    print(f"B={B} L={L} sdpa {sdpa:.1f} us", flush=True)
    rows.append(dict(B=B, L=L, method="sdpa", us=sdpa))
    q = torch.randn(B, H * G, D, device=dev, dtype=torch.float16)
    for bits in (2, 4):
        first, nb = ba.make_kivi(B, L, H, D, 128, bits, dev, None)
        layers = [first] + [ba.make_kivi(B, L, H, D, 128, bits, dev, None)[0] for _ in range(ba.num_copies(nb, dev) - 1)]
        for mod in (kivi_old, kivi_f16, kivi_f16_64, kivi_old, kivi_f16):
            for i, cfg in enumerate(CFGS):
                if mod is kivi_old and i: continue
                mod._DEFAULT_STAGE1 = dict(cfg)
                name = f"kivi{bits} {mod.__name__} w{cfg['num_warps']} s{cfg['num_stages']} mt{cfg['MIN_TOKENS_PER_SPLIT']}"
                try:
                    extra = {}
                    if B * L <= 4096:
                        extra = check_decode_kernel(mod.kivi_decode_attention, mod.kivi_decode_attention_ref, q, D ** -0.5, **first)[1]
                    us = ba.time_calls([lambda kw=kw: mod.kivi_decode_attention(q, scale=D ** -0.5, **kw) for kw in layers], dev) * 1e6
                    r = dict(B=B, L=L, method=name, us=us, bytes=nb, frac_copy=nb / (us * 1e-6) / copy_bw, vs_sdpa=sdpa / us, **extra)
                    rows.append(r)
                    print(f"{name:<44} {us:9.1f} us  {sdpa/us:5.2f}x sdpa  {100*r['frac_copy']:5.1f}% copy {extra.get('check_ok', '')}", flush=True)
                except Exception as e:
                    print(name, "FAILED", type(e).__name__, str(e)[:300], flush=True)
        del layers, first; torch.cuda.empty_cache()
(out_dir / "kivi_f16_ab.json").write_text(json.dumps(dict(copy_bw=copy_bw, triton=triton.__version__, torch=torch.__version__,
    device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows=rows), indent=1))
