"""H200 probe: launch configurations of the rotated ALR-KVD kernel (rank 16), splits from the dispatcher (whole
waves of the programs the compiled kernel lets run at once). Two sets:
  caps  registers capped (maxnreg) so that more programs fit on an SM; "w2"/"w4" configs run only at the shapes
        that take 2 or 4 warps; "default" is uncapped, as the kernel was then (run_device_maxnreg.sh)
  many  where many (sequence, kv head) pairs fill the GPU: 32-token tiles, 4 warps, caps (run_device_configs.sh)

    python benchmarks/results/alrkvd_int8_residual_2026-12-02/probe_launch.py OUT.json caps|many  (repo root, H200)

Same data and timing as benchmarks/bench_attention.py; SDPA timed per shape in the same run."""
import json, sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import bench_attention as ba  # noqa: E402
import kernels.alrkvd_attention as am  # noqa: E402
import kernels.paged_attention as pa  # noqa: E402


def main():
    dev, gen = "cuda", torch.Generator().manual_seed(0)
    H, Hq, D, T = ba.NUM_KV_HEADS, ba.NUM_Q_HEADS, ba.HEAD_DIM, ba.ALRKVD_BLOCK
    scale, rows = D ** -0.5, []
    default_cfg = dict(am._DEFAULT_STAGE1)
    uncapped = dict(MAXNREG_FEW_PAIRS=None)  # the 4-warp launch as it was when the caps were measured
    sets = {
        "caps": ({"default": uncapped, "w2r200": dict(uncapped, maxnreg=200), "w2r168": dict(uncapped, maxnreg=168),
                  "w2r128": dict(uncapped, maxnreg=128), "w4r160": dict(uncapped, maxnreg=160),
                  "w4r128": dict(uncapped, maxnreg=128)},
                 [(1, 4096), (1, 32768), (4, 32768), (8, 4096), (8, 32768), (32, 32768)]),
        "many": ({"default": {}, "n32w2": dict(BLOCK_N=32), "n32w2r168": dict(BLOCK_N=32, maxnreg=168),
                  "n32w2r128": dict(BLOCK_N=32, maxnreg=128), "n64w4r128": dict(NUM_WARPS_MANY_PAIRS=4, maxnreg=128),
                  "n64w4r160": dict(NUM_WARPS_MANY_PAIRS=4, maxnreg=160),
                  "n32w4r128": dict(BLOCK_N=32, NUM_WARPS_MANY_PAIRS=4, maxnreg=128)},
                 [(8, 4096), (8, 32768), (32, 32768), (8, 131072)]),
    }
    configs, shapes = sets[sys.argv[2]]
    for B, L in shapes:
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
        warps = 2 if B * H >= am.MANY_PAIRS else 4
        for cname, cfg in configs.items():
            if cname.startswith("w") and not cname.startswith(f"w{warps}"):
                continue
            am._DEFAULT_STAGE1.clear()
            am._DEFAULT_STAGE1.update(default_cfg, **cfg)
            err = ba.check_decode_kernel(am.alrkvd_decode_attention, am.alrkvd_decode_attention_ref, q, scale,
                                         **first)[1] if B * L <= 32768 else {}
            us = ba.time_calls([lambda kw=kw: am.alrkvd_decode_attention(q, scale=scale, **kw) for kw in layers],
                               dev) * 1e6
            resident = sorted(set(pa._RESIDENT.values()))
            pa._RESIDENT.clear()
            r = dict(B=B, L=L, warps=warps, config=cname, us=us, sdpa_us=sdpa, vs_sdpa=sdpa / us, resident=resident, **err)
            rows.append(r)
            print(f"{B:>3} {L:>7} w{warps} {cname:<8} resident {resident} {us:9.1f} us  vs sdpa {sdpa / us:.2f} "
                  f"{err.get('check_ok', '')}", flush=True)
        del layers, first
        torch.cuda.empty_cache()
    am._DEFAULT_STAGE1.clear()
    am._DEFAULT_STAGE1.update(default_cfg)
    Path(sys.argv[1]).write_text(json.dumps(dict(device=torch.cuda.get_device_name(),
                                                 triton=__import__("triton").__version__, rows=rows), indent=1))


if __name__ == "__main__":
    main()
