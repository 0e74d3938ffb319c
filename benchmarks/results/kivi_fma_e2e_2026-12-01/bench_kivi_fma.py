"""Device A/B of the KIVI decode kernel: before (`kivi_before.py` = `git show f49dc19:kernels/kivi_attention.py`:
tiles rebuilt in fp32, 2 warps) and the repository's (tiles rebuilt in fp16 with one fused multiply-add, 2 warps),
alternated twice; FP16 SDPA in the same run. Usage: python bench_kivi_fma.py OUT_DIR"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3])); sys.path.insert(0, str(Path(__file__).parent))
import torch, triton
from benchmarks.devices import copy_bandwidth
from benchmarks import bench_attention as ba
from kernels.testing import check_decode_kernel
import kernels.kivi_attention as after
import kivi_before as before

dev = "cuda"
H, G, D = 8, 4, 128
out_dir = Path(sys.argv[1]); out_dir.mkdir(parents=True, exist_ok=True)
rows = []
copy_bw = copy_bandwidth(dev)
print(f"copy {copy_bw/1e9:.0f} GB/s", flush=True)
for B, L in [(8, 32768), (1, 4096), (32, 32768), (1, 32768), (8, 131072)]:
    kv_bytes = 2 * B * H * L * D * 2
    data = [(torch.randn(B, H * G, 1, D, device=dev, dtype=torch.float16), torch.randn(B, H, L, D, device=dev, dtype=torch.float16),
             torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(ba.num_copies(kv_bytes, dev))]
    sdpa = ba.time_calls([ba.sdpa_call(*x) for x in data], dev) * 1e6
    del data; torch.cuda.empty_cache()
    rows.append(dict(B=B, L=L, method="sdpa", us=sdpa))
    print(f"B={B} L={L} sdpa {sdpa:.1f} us", flush=True)
    q = torch.randn(B, H * G, D, device=dev, dtype=torch.float16)
    for bits in (2, 4):
        first, nb = ba.make_kivi(B, L, H, D, 128, bits, dev, None)
        layers = [first] + [ba.make_kivi(B, L, H, D, 128, bits, dev, None)[0] for _ in range(ba.num_copies(nb, dev) - 1)]
        for rep in range(2):
            for name, mod in (("before (fp32 rebuild)", before), ("after (fp16 fma rebuild)", after)):
                extra = {}
                if B * L <= 8192:
                    extra = check_decode_kernel(mod.kivi_decode_attention, mod.kivi_decode_attention_ref, q, D ** -0.5, **first)[1]
                us = ba.time_calls([lambda kw=kw: mod.kivi_decode_attention(q, scale=D ** -0.5, **kw) for kw in layers], dev) * 1e6
                r = dict(B=B, L=L, method=f"kivi{bits} {name}", rep=rep, us=us, bytes=nb, frac_copy=nb / (us * 1e-6) / copy_bw,
                         vs_sdpa=sdpa / us, **extra)
                rows.append(r)
                print(f"{r['method']:<34} {us:9.1f} us  {sdpa/us:5.2f}x sdpa  {100*r['frac_copy']:5.1f}% copy "
                      f"{extra.get('max_err_vs_ref', '')}", flush=True)
        del layers, first; torch.cuda.empty_cache()
(out_dir / "kivi_fma_ab_h200.json").write_text(json.dumps(dict(copy_bw=copy_bw, triton=triton.__version__, torch=torch.__version__,
    device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows=rows), indent=1))
