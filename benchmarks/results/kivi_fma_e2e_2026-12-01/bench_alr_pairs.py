"""Device: the repository's ALR-KVD kernel at 4 and 2 warps between 8 and 64 (sequence, kv head) pairs (B=1..8,
8 kv heads), where the dispatcher's threshold (MANY_PAIRS=64) was not measured; SDPA in the same run.
Usage: python bench_alr_pairs.py OUT_DIR"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch, triton
from benchmarks import bench_attention as ba
import kernels.alrkvd_attention as alr

dev = "cuda"; H, G, D = 8, 4, 128
out_dir = Path(sys.argv[1]); out_dir.mkdir(parents=True, exist_ok=True)
rows = []
shipped = dict(alr._DEFAULT_STAGE1)
for B, L in [(2, 32768), (4, 32768), (2, 4096), (4, 4096), (8, 4096), (1, 32768), (8, 32768)]:
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
        for warps in (4, 2):
            alr._DEFAULT_STAGE1 = dict(shipped, num_warps=warps, NUM_WARPS_MANY_PAIRS=None)
            us = ba.time_calls([lambda kw=kw: alr.alrkvd_decode_attention(q, scale=D ** -0.5, **kw) for kw in layers], dev) * 1e6
            rows.append(dict(B=B, L=L, pairs=B * H, method=f"alrkvd-r16 w{warps}", rep=rep, us=us, vs_sdpa=sdpa / us))
            print(f"B={B} L={L} pairs={B*H} alrkvd-r16 w{warps}: {us:8.1f} us  {sdpa/us:5.2f}x sdpa", flush=True)
    alr._DEFAULT_STAGE1 = shipped
    del layers, first; torch.cuda.empty_cache()
(out_dir / "alrkvd_pairs_h200.json").write_text(json.dumps(dict(triton=triton.__version__, torch=torch.__version__,
    date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows=rows), indent=1))
