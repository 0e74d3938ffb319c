"""Device A/B of the merge inside stage 1 for every decode kernel: before (`*_before.py`, `git show
0affa92:kernels/<name>_attention.py`, their imports pointed at `paged_before`: a separate merge kernel) and the
repository's (the last program merges; the caller's ticket buffer, as the engine passes), alternated twice; SDPA in
the same run. Usage: python bench_merge_all.py OUT_DIR"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3])); sys.path.insert(0, str(Path(__file__).parent))
import torch, triton
from benchmarks import bench_attention as ba
import kernels.alrkvd_attention as alr, kernels.kivi_attention as kivi, kernels.paged_attention as paged
import alrkvd_before, kivi_before, paged_before

dev = "cuda"; H, G, D = 8, 4, 128
out_dir = Path(sys.argv[1]); out_dir.mkdir(parents=True, exist_ok=True)
rows = []
tickets = torch.zeros(32 * H, dtype=torch.int32, device=dev)
for B, L in [(1, 4096), (1, 32768), (8, 4096), (8, 32768), (32, 32768)]:
    kv_bytes = 2 * B * H * L * D * 2
    data = [(torch.randn(B, H * G, 1, D, device=dev, dtype=torch.float16), torch.randn(B, H, L, D, device=dev, dtype=torch.float16),
             torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(ba.num_copies(kv_bytes, dev))]
    sdpa = ba.time_calls([ba.sdpa_call(*x) for x in data], dev) * 1e6
    rows.append(dict(B=B, L=L, method="sdpa", us=sdpa)); print(f"B={B} L={L} sdpa {sdpa:.1f} us", flush=True)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H * G, D, device=dev, dtype=torch.float16)
    cases = {"paged-fp16": ([dict(zip(("k_cache", "v_cache", "block_tables"), ba.make_paged_fp16(k, v, 16, gen)),
                                  seq_lens=torch.full((B,), L, dtype=torch.int32, device=dev)) for _, k, v in data],
                            paged_before.paged_decode_attention, paged.paged_decode_attention)}
    del data; torch.cuda.empty_cache()
    for name, make, old, new in (("alrkvd-r16", lambda: ba.make_alrkvd(B, L, H, D, 128, *ba.VARIANTS["alrkvd-r16"], dev, None)[0],
                                  alrkvd_before.alrkvd_decode_attention, alr.alrkvd_decode_attention),
                                 ("kivi2", lambda: ba.make_kivi(B, L, H, D, 128, 2, dev, None)[0],
                                  kivi_before.kivi_decode_attention, kivi.kivi_decode_attention)):
        first = make()
        nb = sum(t.numel() * t.element_size() for t in first["cache"].__dict__.values() if isinstance(t, torch.Tensor))
        cases[name] = ([first] + [make() for _ in range(ba.num_copies(nb, dev) - 1)], old, new)
    for name, (layers, old, new) in cases.items():
        for rep in range(2):
            t_old = ba.time_calls([lambda kw=kw: old(q, scale=D ** -0.5, **kw) for kw in layers], dev) * 1e6
            t_new = ba.time_calls([lambda kw=kw: new(q, scale=D ** -0.5, tickets=tickets, **kw) for kw in layers], dev) * 1e6
            diff = (old(q, scale=D ** -0.5, **layers[0]).float() - new(q, scale=D ** -0.5, tickets=tickets, **layers[0]).float()).abs().max().item()
            rows.append(dict(B=B, L=L, method=name, rep=rep, separate_us=t_old, merged_us=t_new, sdpa_us=sdpa, max_abs_diff=diff))
            print(f"B={B} L={L} {name:<11} separate merge {t_old:8.1f} us  merged in stage 1 {t_new:8.1f} us  "
                  f"({sdpa / t_old:4.2f}x -> {sdpa / t_new:4.2f}x sdpa)  max|diff| {diff:.2e}", flush=True)
        assert int(tickets.abs().sum()) == 0, "tickets not back to 0"
    del cases; torch.cuda.empty_cache()
(out_dir / "merge_all_ab_h200.json").write_text(json.dumps(dict(triton=triton.__version__, torch=torch.__version__,
    date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows=rows), indent=1))
