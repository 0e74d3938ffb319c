"""H200 probe: the ALR-KVD decode kernel with several kv heads per program (block-diagonal rows, `head_slots`)
against the kernel of one kv head per program, rank 16, rotated keys. Each shape runs every variant twice,
alternated; splits from the dispatcher (whole waves of the programs that fit).

    python benchmarks/results/alrkvd_head_groups_2026-12-03/probe_groups.py OUT.json BEFORE.py [GROUPED.py
        [VARIANT ...]]  (repo root, H200)

BEFORE.py: the kernel before this change (`git show c1cea8a:kernels/alrkvd_attention.py > BEFORE.py`), run with its
own defaults. GROUPED.py: the kernel with head slots (`git apply head_groups_not_kept.patch` on c1cea8a; default:
this tree's). The variants of the grouped kernel set its launch: g<slots>-n<BLOCK_N>-w<warps>[-r<maxnreg>]; the
VARIANTs named run (default: all). The n* variants launch the per-head kernel (this tree's, at c1cea8a) with a
fixed tile, warps and register cap, whatever the batch.
Same data and timing as benchmarks/bench_attention.py; SDPA timed per shape in the same run."""
import importlib.util, json, os, sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import bench_attention as ba  # noqa: E402
import kernels.alrkvd_attention as am  # noqa: E402
import kernels.paged_attention as pa  # noqa: E402

SHAPES = [tuple(map(int, s.split("x"))) for s in os.environ.get(  # B x L, e.g. SHAPES=8x32768,1x4096
    "SHAPES", "8x32768,32x32768,8x131072,8x4096,1x4096,1x32768").split(",")]
VARIANTS = {  # name: this tree's launch (None: the module BEFORE.py with its defaults)
    "before": None,
    "g4-n64-w2": dict(SLOTS=4, BLOCK_N=64, num_warps=2),
    "g4-n64-w4": dict(SLOTS=4, BLOCK_N=64, num_warps=4),
    "g4-n32-w2": dict(SLOTS=4, BLOCK_N=32, num_warps=2),
    "g4-n32-w1": dict(SLOTS=4, BLOCK_N=32, num_warps=1),
    "g4-n64-w1": dict(SLOTS=4, BLOCK_N=64, num_warps=1),
    "g2-n64-w2": dict(SLOTS=2, BLOCK_N=64, num_warps=2),
    "g1-n64-w2-r168": dict(SLOTS=1, BLOCK_N=64, num_warps=2, maxnreg=168),
    "g4-n64-w4-r168": dict(SLOTS=4, BLOCK_N=64, num_warps=4, maxnreg=168),
    # launches of the per-head kernel (this tree's, no GROUPED.py): n<BLOCK_N>-w<warps>[-r<maxnreg>]
    "n64-w2-r168": dict(BLOCK_N=64, num_warps=2, maxnreg=168),
    "n128-w2": dict(BLOCK_N=128, num_warps=2),
    "n128-w2-r200": dict(BLOCK_N=128, num_warps=2, maxnreg=200),
    "n128-w4": dict(BLOCK_N=128, num_warps=4),
    "n128-w4-r160": dict(BLOCK_N=128, num_warps=4, maxnreg=160),
}


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = sys.modules[name] = importlib.util.module_from_spec(spec)  # (its dataclass looks itself up there)
    spec.loader.exec_module(mod)
    return mod


def main():
    dev, gen = "cuda", torch.Generator().manual_seed(0)
    global am
    before = load("alrkvd_before", sys.argv[2])
    if len(sys.argv) > 3:
        am = load("alrkvd_grouped", sys.argv[3])
    variants = {n: v for n, v in VARIANTS.items() if len(sys.argv) <= 4 or n in sys.argv[4:]}
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
            for name, launch in variants.items():
                mod = before if launch is None else am
                if launch is not None:
                    am._DEFAULT_STAGE1.clear()
                    am._DEFAULT_STAGE1.update(num_stages=2, MIN_TOKENS_PER_SPLIT=default_cfg["MIN_TOKENS_PER_SPLIT"],
                                              **launch)
                pa._RESIDENT.clear()
                try:
                    err = ba.check_decode_kernel(mod.alrkvd_decode_attention, am.alrkvd_decode_attention_ref, q, scale,
                                                 **first)[1] if rep == 1 and B * L <= 32768 else {}
                    us = ba.time_calls([lambda kw=kw: mod.alrkvd_decode_attention(q, scale=scale, **kw)
                                        for kw in layers], dev) * 1e6
                except Exception as exc:  # noqa: BLE001 - a variant that does not compile is reported, not fatal
                    print(f"{B:>3} {L:>7} {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                resident = sorted(set(pa._RESIDENT.values()))
                rows.append(dict(B=B, L=L, rep=rep, variant=name, us=us, sdpa_us=sdpa, vs_sdpa=sdpa / us,
                                 resident=resident, **err))
                print(f"{B:>3} {L:>7} {rep} {name:<16} resident {resident} {us:9.1f} us  vs sdpa {sdpa / us:.2f} "
                      f"{err.get('check_ok', '')}", flush=True)
        del layers, first
        torch.cuda.empty_cache()
    am._DEFAULT_STAGE1.clear()
    am._DEFAULT_STAGE1.update(default_cfg)
    Path(sys.argv[1]).write_text(json.dumps(dict(device=torch.cuda.get_device_name(),
                                                 triton=__import__("triton").__version__, rows=rows), indent=1))
    names = [n for n in variants if any(r["variant"] == n for r in rows)]
    print("\nus (best of two), rank 16 rotated")
    print(f"{'B':>3} {'L':>7} {'sdpa':>8} " + " ".join(f"{n:>15}" for n in names))
    for B, L in SHAPES:
        cells = [min((r["us"] for r in rows if (r["B"], r["L"], r["variant"]) == (B, L, n)), default=float("nan"))
                 for n in names]
        sd = next((r["sdpa_us"] for r in rows if (r["B"], r["L"]) == (B, L)), float("nan"))
        print(f"{B:>3} {L:>7} {sd:8.1f} " + " ".join(f"{c:15.1f}" for c in cells))


if __name__ == "__main__":
    main()
