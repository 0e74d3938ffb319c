"""Device A/B: the ALR-KVD decode kernel with a separate merge kernel (`alrkvd_before.py` = `git show
0affa92:kernels/alrkvd_attention.py`) and with the merge in stage 1 (the repository's, with a caller-held ticket
buffer as the engine passes), alternated twice; SDPA in the same run. Usage: python bench_fused_merge.py OUT_DIR"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3])); sys.path.insert(0, str(Path(__file__).parent))
import torch, triton
from benchmarks.devices import copy_bandwidth
from benchmarks import bench_attention as ba
from kernels.testing import check_decode_kernel
import kernels.alrkvd_attention as after
import alrkvd_before as before

dev = "cuda"; H, G, D = 8, 4, 128
out_dir = Path(sys.argv[1]); out_dir.mkdir(parents=True, exist_ok=True)
rows = []
copy_bw = copy_bandwidth(dev)
tickets = torch.zeros(32 * H, dtype=torch.int32, device=dev)
for B, L in [(1, 4096), (1, 32768), (8, 4096), (8, 32768), (32, 32768)]:
    kv_bytes = 2 * B * H * L * D * 2
    data = [(torch.randn(B, H * G, 1, D, device=dev, dtype=torch.float16), torch.randn(B, H, L, D, device=dev, dtype=torch.float16),
             torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(ba.num_copies(kv_bytes, dev))]
    sdpa = ba.time_calls([ba.sdpa_call(*x) for x in data], dev) * 1e6
    del data; torch.cuda.empty_cache()
    rows.append(dict(B=B, L=L, method="sdpa", us=sdpa)); print(f"B={B} L={L} sdpa {sdpa:.1f} us", flush=True)
    q = torch.randn(B, H * G, D, device=dev, dtype=torch.float16)
    for variant in ("alrkvd-r16", "alrkvd-mixed"):
        first, nb = ba.make_alrkvd(B, L, H, D, 128, *ba.VARIANTS[variant], dev, None)
        layers = [first] + [ba.make_alrkvd(B, L, H, D, 128, *ba.VARIANTS[variant], dev, None)[0] for _ in range(ba.num_copies(nb, dev) - 1)]
        for rep in range(2):
            for name, call in (("separate merge kernel", before.alrkvd_decode_attention),
                               ("merge in stage 1", lambda *a, **kw: after.alrkvd_decode_attention(*a, tickets=tickets, **kw))):
                extra = {}
                if B * L <= 8192:
                    extra = check_decode_kernel(call, after.alrkvd_decode_attention_ref, q, D ** -0.5, **first)[1]
                us = ba.time_calls([lambda kw=kw: call(q, scale=D ** -0.5, **kw) for kw in layers], dev) * 1e6
                r = dict(B=B, L=L, method=f"{variant} {name}", rep=rep, us=us, bytes=nb, frac_copy=nb / (us * 1e-6) / copy_bw,
                         vs_sdpa=sdpa / us, **extra)
                rows.append(r)
                print(f"B={B} L={L} {r['method']:<38} {us:8.1f} us  {sdpa/us:5.2f}x sdpa {extra.get('max_err_vs_ref', '')}", flush=True)
        assert int(tickets.abs().sum()) == 0, "tickets not back to 0"
        del layers, first; torch.cuda.empty_cache()
(out_dir / "fused_merge_ab_h200.json").write_text(json.dumps(dict(copy_bw=copy_bw, triton=triton.__version__, torch=torch.__version__,
    date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows=rows), indent=1))
