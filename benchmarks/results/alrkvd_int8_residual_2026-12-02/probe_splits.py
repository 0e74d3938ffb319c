"""H200 probe: the rotated ALR-KVD kernel as it was before this folder's changes (alrkvd_attention_before.py; rank 16)
at several split counts per shape, and the registers each launch configuration compiles to. Finds how many
programs per SM the kernel wants.

    python benchmarks/results/alrkvd_int8_residual_2026-12-02/probe_splits.py OUT.json      (repo root, H200)

Same data and timing as benchmarks/bench_attention.py; SDPA timed per shape in the same run."""
import json, sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import bench_attention as ba  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_prototype import load_module  # noqa: E402

am = load_module("alrkvd_before", Path(__file__).resolve().parent / "alrkvd_attention_before.py")
from kernels.paged_attention import MAX_SPLITS, default_num_splits  # noqa: E402


def compiled_regs():
    """(num_warps, n_regs, n_spills) of every stage-1 binary compiled so far."""
    out = set()
    for caches in getattr(am._alrkvd_decode_stage1, "device_caches", {}).values():  # none under the interpreter
        for k in caches[0].values():
            out.add((k.metadata.num_warps, k.n_regs, k.n_spills))
    return sorted(out)


def main():
    dev, gen = "cuda", torch.Generator().manual_seed(0)
    H, Hq, D, T = ba.NUM_KV_HEADS, ba.NUM_Q_HEADS, ba.HEAD_DIM, ba.ALRKVD_BLOCK
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    scale, rows = D ** -0.5, []
    default_cfg = dict(am._DEFAULT_STAGE1)
    configs = {"default": {}, "n32w2": dict(BLOCK_N=32, num_warps=2, NUM_WARPS_MANY_PAIRS=2),
               "n64w4": dict(BLOCK_N=64, num_warps=4, NUM_WARPS_MANY_PAIRS=4)}
    shapes = [(1, 4096), (1, 32768), (1, 131072), (2, 32768), (4, 32768), (8, 4096), (8, 32768), (8, 131072),
              (16, 32768), (32, 32768)]
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
        pairs, most = B * H, min(MAX_SPLITS, L // 128)
        default = default_num_splits(B, H, (L // T + 1) * T, torch.device(dev), 128)
        cands = sorted({default} | {max(1, min(most, k * sms // pairs)) for k in (2, 3, 4, 5, 6, 7, 8, 12, 16)})
        for cname, cfg in configs.items():
            if cname != "default" and (B, L) not in ((8, 32768), (2, 32768), (32, 32768)):
                continue
            am._DEFAULT_STAGE1.clear()
            am._DEFAULT_STAGE1.update(default_cfg, **cfg)
            for splits in cands:
                us = ba.time_calls([lambda kw=kw: am.alrkvd_decode_attention(q, scale=scale, num_splits=splits, **kw)
                                    for kw in layers], dev) * 1e6
                r = dict(B=B, L=L, config=cname, splits=splits, default_splits=splits == default,
                         programs=pairs * splits, per_sm=pairs * splits / sms, us=us, sdpa_us=sdpa, vs_sdpa=sdpa / us)
                rows.append(r)
                print(f"{B:>3} {L:>7} {cname:<8} splits {splits:>3}{'*' if splits == default else ' '} "
                      f"programs/SM {pairs * splits / sms:5.2f} {us:9.1f} us  vs sdpa {sdpa / us:.2f}", flush=True)
        del layers, first
        torch.cuda.empty_cache()
    am._DEFAULT_STAGE1.clear()
    am._DEFAULT_STAGE1.update(default_cfg)
    regs = compiled_regs()
    print("stage-1 binaries (num_warps, n_regs, n_spills):", regs)
    Path(sys.argv[1]).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), sms=sms,
                                                 triton=__import__("triton").__version__, binaries=regs, rows=rows), indent=1))


if __name__ == "__main__":
    main()
