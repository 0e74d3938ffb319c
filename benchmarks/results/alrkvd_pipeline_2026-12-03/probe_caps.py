"""H200 probe: registers of the rotated ALR-KVD kernel's 2-warp launch (rank 16) capped with maxnreg, so that more
programs fit on an SM (its main loop compiles without spills down to 168 registers, sm_90, triton 3.9). Each shape
runs every cap twice, alternated; splits from the dispatcher (whole waves of the programs that fit).

    python benchmarks/results/alrkvd_pipeline_2026-12-03/probe_caps.py OUT.json  (repo root, H200)

Same data and timing as benchmarks/bench_attention.py; SDPA timed per shape in the same run."""
import json, sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import bench_attention as ba  # noqa: E402
import kernels.alrkvd_attention as am  # noqa: E402
import kernels.paged_attention as pa  # noqa: E402

CAPS = (None, 224, 200, 168, 144, 128)
SHAPES = [(8, 4096), (8, 32768), (32, 32768), (8, 131072)]


def main():
    dev, gen = "cuda", torch.Generator().manual_seed(0)
    H, Hq, D, T = ba.NUM_KV_HEADS, ba.NUM_Q_HEADS, ba.HEAD_DIM, ba.ALRKVD_BLOCK
    scale, rows = D ** -0.5, []
    default_cfg = dict(am._DEFAULT_STAGE1)
    for B, L in SHAPES:
        kv_bytes = 2 * B * H * L * D * 2
        data = [(torch.randn(B, Hq, 1, D, device=dev, dtype=torch.float16),
                 torch.randn(B, H, L, D, device=dev, dtype=torch.float16),
                 torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(ba.num_copies(kv_bytes, dev))]
        sdpa = ba.time_calls([ba.sdpa_call(*d) for d in data], dev) * 1e6
        del data
        torch.cuda.empty_cache()
        make = lambda: ba.make_alrkvd(B, L, H, D, T, *ba.VARIANTS["alrkvd-rot-r16"], dev, gen)
        first, nbytes = make()
        layers = [first] + [make()[0] for _ in range(ba.num_copies(nbytes, dev) - 1)]
        q = torch.randn(B, Hq, D, device=dev, dtype=torch.float16)
        for rep in (1, 2):
            for cap in CAPS:
                am._DEFAULT_STAGE1.clear()
                am._DEFAULT_STAGE1.update(default_cfg, **({"maxnreg": cap} if cap else {}))
                pa._RESIDENT.clear()
                err = ba.check_decode_kernel(am.alrkvd_decode_attention, am.alrkvd_decode_attention_ref, q, scale,
                                             **first)[1] if rep == 1 and B * L <= 32768 else {}
                us = ba.time_calls([lambda kw=kw: am.alrkvd_decode_attention(q, scale=scale, **kw) for kw in layers],
                                   dev) * 1e6
                resident = sorted(set(pa._RESIDENT.values()))
                rows.append(dict(B=B, L=L, rep=rep, maxnreg=cap, us=us, sdpa_us=sdpa, vs_sdpa=sdpa / us,
                                 resident=resident, **err))
                print(f"{B:>3} {L:>7} {rep} maxnreg {str(cap):>4} resident {resident} {us:9.1f} us  vs sdpa "
                      f"{sdpa / us:.2f} {err.get('check_ok', '')}", flush=True)
        del layers, first
        torch.cuda.empty_cache()
    am._DEFAULT_STAGE1.clear()
    am._DEFAULT_STAGE1.update(default_cfg)
    Path(sys.argv[1]).write_text(json.dumps(dict(device=torch.cuda.get_device_name(),
                                                 triton=__import__("triton").__version__, rows=rows), indent=1))
    print("\nus (best of two), rank 16 rotated, 2 warps")
    print(f"{'B':>3} {'L':>7} {'sdpa':>8} " + " ".join(f"{str(c):>9}" for c in CAPS))
    for B, L in SHAPES:
        cells = [min(r["us"] for r in rows if (r["B"], r["L"], r["maxnreg"]) == (B, L, c)) for c in CAPS]
        sd = next(r["sdpa_us"] for r in rows if (r["B"], r["L"]) == (B, L))
        print(f"{B:>3} {L:>7} {sd:8.1f} " + " ".join(f"{c:9.1f}" for c in cells))


if __name__ == "__main__":
    main()
