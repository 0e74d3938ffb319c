"""Device A/B of the repo's ALR-KVD decode kernel: before (alrkvd_old: fp32 rebuilt keys) and now (fp16 rebuilt keys
and RoPE), several launch configs, SDPA in the same run."""
import json, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3])); sys.path.insert(0, str(Path(__file__).parent))
import torch, triton
from benchmarks.devices import copy_bandwidth
from benchmarks import bench_attention as ba
from kernels.testing import check_decode_kernel
import kernels.alrkvd_attention as new
import alrkvd_old as old
dev = "cuda"
H, G, D = 8, 4, 128
out_dir = Path(sys.argv[1]); out_dir.mkdir(parents=True, exist_ok=True)
rows = []
copy_bw = copy_bandwidth(dev)
print(f"copy {copy_bw/1e9:.0f} GB/s", flush=True)
CFGS = [dict(BLOCK_N=64, num_warps=4, num_stages=2, MIN_TOKENS_PER_SPLIT=128), dict(BLOCK_N=64, num_warps=4, num_stages=3, MIN_TOKENS_PER_SPLIT=128),
        dict(BLOCK_N=32, num_warps=2, num_stages=2, MIN_TOKENS_PER_SPLIT=128), dict(BLOCK_N=32, num_warps=2, num_stages=3, MIN_TOKENS_PER_SPLIT=128)]
SHAPES = [(8, 32768), (1, 4096), (1, 32768), (32, 32768), (8, 131072)]
for B, L in SHAPES:
    kv_bytes = 2 * B * H * L * D * 2
    data = [(torch.randn(B, H * G, 1, D, device=dev, dtype=torch.float16), torch.randn(B, H, L, D, device=dev, dtype=torch.float16),
             torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(ba.num_copies(kv_bytes, dev))]
    sdpa = ba.time_calls([ba.sdpa_call(*x) for x in data], dev) * 1e6
    del data; torch.cuda.empty_cache()
    rows.append(dict(B=B, L=L, method="sdpa", us=sdpa))
    print(f"B={B} L={L} sdpa {sdpa:.1f} us", flush=True)
    q = torch.randn(B, H * G, D, device=dev, dtype=torch.float16)
    for var in ("alrkvd-r16", "alrkvd-mixed"):
        first, nb = ba.make_alrkvd(B, L, H, D, 128, *ba.VARIANTS[var], dev, None)
        layers = [first] + [ba.make_alrkvd(B, L, H, D, 128, *ba.VARIANTS[var], dev, None)[0] for _ in range(ba.num_copies(nb, dev) - 1)]
        for mod in (old, new, old, new):  # alternated twice
            for i, cfg in enumerate(CFGS):
                if mod is old and i: continue
                if (B, L) not in ((8, 32768), (1, 4096)) and i not in (0, 1): continue
                mod._DEFAULT_STAGE1 = dict(cfg)
                name = f"{var} {'before' if mod is old else 'fp16-keys'} n{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg['num_stages']}"
                try:
                    extra = {}
                    if B * L <= 8192:
                        extra = check_decode_kernel(mod.alrkvd_decode_attention, mod.alrkvd_decode_attention_ref, q, D ** -0.5, **first)[1]
                    us = ba.time_calls([lambda kw=kw: mod.alrkvd_decode_attention(q, scale=D ** -0.5, **kw) for kw in layers], dev) * 1e6
                    r = dict(B=B, L=L, method=name, us=us, bytes=nb, frac_copy=nb / (us * 1e-6) / copy_bw, vs_sdpa=sdpa / us, **extra)
                    rows.append(r)
                    print(f"{name:<44} {us:9.1f} us  {sdpa/us:5.2f}x sdpa  {100*r['frac_copy']:5.1f}% copy {extra}", flush=True)
                except Exception as e:
                    print(name, "FAILED", type(e).__name__, str(e)[:300], flush=True)
        del layers, first; torch.cuda.empty_cache()
(out_dir / "alrkvd_fp16_keys_ab.json").write_text(json.dumps(dict(copy_bw=copy_bw, triton=triton.__version__, torch=torch.__version__,
    device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows=rows), indent=1))
