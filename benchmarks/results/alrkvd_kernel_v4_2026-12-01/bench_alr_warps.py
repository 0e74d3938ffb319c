"""Device: launch configurations of the repository's ALR-KVD kernel (fp16 rebuilt keys), SDPA in the same run."""
import json, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch, triton
from benchmarks.devices import copy_bandwidth
from benchmarks import bench_attention as ba
import kernels.alrkvd_attention as new
dev = "cuda"; H, G, D = 8, 4, 128
out_dir = Path(sys.argv[1]); out_dir.mkdir(parents=True, exist_ok=True)
rows = []
copy_bw = copy_bandwidth(dev)
CFGS = [dict(BLOCK_N=64, num_warps=4), dict(BLOCK_N=64, num_warps=2), dict(BLOCK_N=128, num_warps=4), dict(BLOCK_N=32, num_warps=1)]
for B, L in [(8, 32768), (1, 4096), (32, 32768), (1, 32768)]:
    kv_bytes = 2 * B * H * L * D * 2
    data = [(torch.randn(B, H * G, 1, D, device=dev, dtype=torch.float16), torch.randn(B, H, L, D, device=dev, dtype=torch.float16),
             torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(ba.num_copies(kv_bytes, dev))]
    sdpa = ba.time_calls([ba.sdpa_call(*x) for x in data], dev) * 1e6
    del data; torch.cuda.empty_cache()
    rows.append(dict(B=B, L=L, method="sdpa", us=sdpa)); print(f"B={B} L={L} sdpa {sdpa:.1f} us", flush=True)
    q = torch.randn(B, H * G, D, device=dev, dtype=torch.float16)
    first, nb = ba.make_alrkvd(B, L, H, D, 128, *ba.VARIANTS["alrkvd-r16"], dev, None)
    layers = [first] + [ba.make_alrkvd(B, L, H, D, 128, *ba.VARIANTS["alrkvd-r16"], dev, None)[0] for _ in range(ba.num_copies(nb, dev) - 1)]
    for rep in range(2):
        for cfg in CFGS:
            new._DEFAULT_STAGE1 = dict(new._DEFAULT_STAGE1, **cfg)
            try:
                us = ba.time_calls([lambda kw=kw: new.alrkvd_decode_attention(q, scale=D ** -0.5, **kw) for kw in layers], dev) * 1e6
                rows.append(dict(B=B, L=L, method=f"alrkvd-r16 n{cfg['BLOCK_N']} w{cfg['num_warps']}", us=us, vs_sdpa=sdpa / us))
                print(f"alrkvd-r16 n{cfg['BLOCK_N']} w{cfg['num_warps']}: {us:8.1f} us  {sdpa/us:5.2f}x sdpa", flush=True)
            except Exception as e:
                print(cfg, "FAILED", type(e).__name__, str(e)[:200], flush=True)
    del layers, first; torch.cuda.empty_cache()
(out_dir / "alrkvd_launch_configs_h200.json").write_text(json.dumps(dict(copy_bw=copy_bw, triton=triton.__version__,
    date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows=rows), indent=1))
