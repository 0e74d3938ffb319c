"""Device probe: what the second kernel (decode_reduce, merging the splits' partials) costs. The ALR-KVD and KIVI
decode calls timed whole, with stage 2 replaced by nothing (stage 1 alone), and stage 2 alone; SDPA in the same run.
Usage: python probe_stage2.py OUT_DIR"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch, triton
from benchmarks import bench_attention as ba
import kernels.alrkvd_attention as alr
import kernels.kivi_attention as kivi
from kernels.paged_attention import decode_reduce, default_num_splits

dev = "cuda"; H, G, D = 8, 4, 128
out_dir = Path(sys.argv[1]); out_dir.mkdir(parents=True, exist_ok=True)
rows = []
skip = lambda mid_o, mid_lse, out: out
for B, L in [(1, 4096), (1, 32768), (8, 32768)]:
    kv_bytes = 2 * B * H * L * D * 2
    data = [(torch.randn(B, H * G, 1, D, device=dev, dtype=torch.float16), torch.randn(B, H, L, D, device=dev, dtype=torch.float16),
             torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(ba.num_copies(kv_bytes, dev))]
    sdpa = ba.time_calls([ba.sdpa_call(*x) for x in data], dev) * 1e6
    del data; torch.cuda.empty_cache()
    rows.append(dict(B=B, L=L, method="sdpa", us=sdpa)); print(f"B={B} L={L} sdpa {sdpa:.1f} us", flush=True)
    q = torch.randn(B, H * G, D, device=dev, dtype=torch.float16)
    for name, mod, fn, make in (("alrkvd-r16", alr, "alrkvd_decode_attention",
                                 lambda: ba.make_alrkvd(B, L, H, D, 128, *ba.VARIANTS["alrkvd-r16"], dev, None)),
                                ("kivi2", kivi, "kivi_decode_attention", lambda: ba.make_kivi(B, L, H, D, 128, 2, dev, None))):
        first, nb = make()
        layers = [first] + [make()[0] for _ in range(ba.num_copies(nb, dev) - 1)]
        call = getattr(mod, fn)
        for rep in range(2):
            whole = ba.time_calls([lambda kw=kw: call(q, scale=D ** -0.5, **kw) for kw in layers], dev) * 1e6
            mod.decode_reduce = skip
            stage1 = ba.time_calls([lambda kw=kw: call(q, scale=D ** -0.5, **kw) for kw in layers], dev) * 1e6
            mod.decode_reduce = decode_reduce
            rows.append(dict(B=B, L=L, method=name, rep=rep, whole_us=whole, stage1_us=stage1, sdpa_us=sdpa))
            print(f"B={B} L={L} {name}: whole {whole:7.1f} us, stage 1 alone {stage1:7.1f} us (SDPA {sdpa:.1f})", flush=True)
        del layers, first; torch.cuda.empty_cache()
    P = default_num_splits(B, H, L, torch.device(dev), 128) + 1  # as the ALR-KVD call
    mids = [(torch.randn(B, H * G, P, D, device=dev), torch.randn(B, H * G, P, device=dev), torch.empty(B, H * G, D, device=dev, dtype=torch.float16))
            for _ in range(8)]
    red = ba.time_calls([lambda m=m: decode_reduce(*m) for m in mids], dev) * 1e6
    rows.append(dict(B=B, L=L, method="decode_reduce alone", partials=P, us=red)); print(f"B={B} L={L} reduce alone ({P} partials) {red:.1f} us", flush=True)
(out_dir / "probe_stage2_h200.json").write_text(json.dumps(dict(triton=triton.__version__, torch=torch.__version__,
    date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows=rows), indent=1))
