"""H200 probe: the paged fp16 and KIVI decode kernels with the query group padded to 16 rows (as before 449c3b4)
against a power of two (4 rows for a group of 4), each twice, alternated; FP16 SDPA per shape in the same run.
The padding is the launchers' `_group_block`, replaced here for the `pad16` arm. Same data and timing as
benchmarks/bench_attention.py.

    python benchmarks/results/alrkvd_query_rows_2026-12-03/probe_pad.py OUT.json  (repo root, H200)"""
import json, sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import bench_attention as ba  # noqa: E402
import kernels.kivi_attention as ka  # noqa: E402
import kernels.paged_attention as pa  # noqa: E402

PADDING = {"pad16": lambda g: max(16, triton.next_power_of_2(g)), "pow2": pa._group_block}
SHAPES = [(8, 32768), (32, 32768), (32, 4096), (8, 4096), (1, 4096), (1, 32768)]


def main():
    dev, gen, rows = "cuda", torch.Generator().manual_seed(0), []
    H, Hq, D = ba.NUM_KV_HEADS, ba.NUM_Q_HEADS, ba.HEAD_DIM
    scale = D ** -0.5
    for B, L in SHAPES:
        kv_bytes = 2 * B * H * L * D * 2
        data = [(torch.randn(B, Hq, 1, D, device=dev, dtype=torch.float16),
                 torch.randn(B, H, L, D, device=dev, dtype=torch.float16),
                 torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(ba.num_copies(kv_bytes, dev))]
        sdpa = ba.time_calls([ba.sdpa_call(*d) for d in data], dev) * 1e6
        paged = []
        for q, k, v in data:
            kc, vc, bt = ba.make_paged_fp16(k, v, ba.FP16_BLOCK, gen)
            paged.append((q[:, :, 0], kc, vc, bt, torch.full((B,), L, dtype=torch.int32, device=dev)))
        del data
        first, nbytes = ba.make_kivi(B, L, H, D, ba.ALRKVD_BLOCK, 2, dev, gen)
        kivi = [first] + [ba.make_kivi(B, L, H, D, ba.ALRKVD_BLOCK, 2, dev, gen)[0]
                          for _ in range(ba.num_copies(nbytes, dev) - 1)]
        qk = torch.randn(B, Hq, D, device=dev, dtype=torch.float16)
        for rep in (1, 2):
            for arm, pad in PADDING.items():
                pa._group_block = ka._group_block = pad
                pa._RESIDENT.clear()
                for kernel, calls in (("paged-fp16", [lambda p=p: pa.paged_decode_attention(*p, scale) for p in paged]),
                                      ("kivi2", [lambda kw=kw: ka.kivi_decode_attention(qk, scale=scale, **kw)
                                                 for kw in kivi])):
                    us = ba.time_calls(calls, dev) * 1e6
                    rows.append(dict(B=B, L=L, rep=rep, arm=arm, kernel=kernel, us=us, sdpa_us=sdpa))
                    print(f"{B:>3} {L:>7} {rep} {kernel:<10} {arm:<6} {us:9.1f} us  vs sdpa {sdpa / us:.2f}", flush=True)
        del paged, kivi, first
        torch.cuda.empty_cache()
    pa._group_block = ka._group_block = PADDING["pow2"]
    Path(sys.argv[1]).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), triton=triton.__version__,
                                                 rows=rows), indent=1))
    print("\nus (best of two)")
    for B, L in SHAPES:
        best = {(k, a): min(r["us"] for r in rows if (r["B"], r["L"], r["kernel"], r["arm"]) == (B, L, k, a))
                for k in ("paged-fp16", "kivi2") for a in PADDING}
        sd = next(r["sdpa_us"] for r in rows if (r["B"], r["L"]) == (B, L))
        print(f"{B:>3} {L:>7} sdpa {sd:8.1f}  " + "  ".join(f"{k} {a} {v:8.1f}" for (k, a), v in best.items()))


if __name__ == "__main__":
    main()
