"""A/B timing of the ALR-KVD decode kernel on the GPU: this tree's kernel, under launch overrides, against the same
kernel from another file (an earlier commit's), each arm twice and alternated, FP16 SDPA timed per shape in the same
run. Same data, timing and check as bench_attention.py.

    python benchmarks/compare_kernels.py --out OUT.json --before BEFORE.py \
        --arms before now n64:BLOCK_N=64 try@TRY.py --shapes 8x32768 1x4096 [--variant alrkvd-rot-r16]

Arms: `before` is BEFORE.py with its own launch (`git show REV:kernels/alrkvd_attention.py > BEFORE.py`; its imports
from kernels.* resolve to this tree; kernels older than 2026-12-03's head-major `v_resid` read the values' codes
row-major: give them so with --before-values-row-major); `now` is this tree's kernel as it launches;
`NAME:KEY=INT,...` is this tree's kernel with those keys of `_DEFAULT_STAGE1` replaced (BLOCK_N, num_warps, maxnreg,
...), whatever the batch; `NAME@FILE.py` is the kernel of FILE.py with its own launch, like `before` (a candidate
change, timed against `now` in the same run). A NAME ending in `+kt` reads the keys' residual codes copied token-major
(`[T, H, packed]` in memory, the format's layout before BENCHMARKS.md section 2s) through the same strides, instead
of head-major (section 2s measured the layouts so, at aa7c67e, with arms that copied them the other way, `+kh`).
The check against the PyTorch reference runs in the first round where B * L <= --check-tokens.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import bench_attention as ba  # noqa: E402
import kernels.alrkvd_attention as now  # noqa: E402
import kernels.paged_attention as paged  # noqa: E402


def load_module(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = sys.modules[name] = importlib.util.module_from_spec(spec)  # (its dataclass looks itself up there)
    spec.loader.exec_module(mod)
    return mod


def stage1_builds(mod) -> set:
    """(warps, registers, spilled bytes, shared memory) of each build of `mod`'s stage 1 in Triton's cache."""
    builds = set()
    try:  # Triton's cache layout is not an API: report nothing rather than fail
        for cache in mod._alrkvd_decode_stage1.device_caches.values():
            for kernel in cache[0].values():
                kernel._init_handles()
                builds.add((kernel.metadata.num_warps, kernel.n_regs, kernel.n_spills, kernel.metadata.shared))
    except (AttributeError, IndexError, TypeError):
        pass
    return builds


def row_major(kw: dict, name: str) -> dict:
    """Kernel inputs `kw` with the cache's tensor `name` copied to its logical order (row-major in memory): the same
    codes, another layout, read through the same strides."""
    return dict(kw, cache=dataclasses.replace(kw["cache"], **{name: getattr(kw["cache"], name).contiguous()}))


def parse_arm(text: str) -> tuple[str, dict | str | None]:
    """'before' -> (before, None); 'now' -> (now, {}); 'n64:BLOCK_N=64,num_warps=2' -> (n64, {...});
    'try@TRY.py' -> (try, 'TRY.py')."""
    if "@" in text:
        return tuple(text.split("@", 1))
    name, _, overrides = text.partition(":")
    if name == "before":
        return name, None
    return name, {k: int(v) for k, v in (kv.split("=") for kv in overrides.split(",") if kv)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--before", help="the kernel module file of arm `before`")
    p.add_argument("--arms", nargs="+", default=["before", "now"])
    p.add_argument("--shapes", nargs="+", default=["8x32768", "32x32768", "8x131072", "8x4096", "1x4096", "1x32768"],
                   metavar="BxL")
    p.add_argument("--variant", default="alrkvd-rot-r16", choices=list(ba.VARIANTS))
    p.add_argument("--check-tokens", type=int, default=32768)
    p.add_argument("--before-values-row-major", action="store_true",
                   help="give `before` the values' codes row-major (kernels before 2026-12-03's head-major v_resid)")
    args = p.parse_args(argv)
    arms = dict(map(parse_arm, args.arms))
    before = load_module("alrkvd_before", args.before) if "before" in arms else None
    files = {name: load_module(f"alrkvd_{name}", path) for name, path in arms.items() if isinstance(path, str)}
    dev, gen = "cuda", torch.Generator().manual_seed(0)
    H, Hq, D, T = ba.NUM_KV_HEADS, ba.NUM_Q_HEADS, ba.HEAD_DIM, ba.ALRKVD_BLOCK
    scale, rows = D ** -0.5, []
    default_cfg = dict(now._DEFAULT_STAGE1)
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes]
    for B, L in shapes:
        kv_bytes = 2 * B * H * L * D * 2
        data = [(torch.randn(B, Hq, 1, D, device=dev, dtype=torch.float16),
                 torch.randn(B, H, L, D, device=dev, dtype=torch.float16),
                 torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(ba.num_copies(kv_bytes, dev))]
        sdpa = ba.time_calls([ba.sdpa_call(*d) for d in data], dev) * 1e6
        del data
        torch.cuda.empty_cache()
        make = lambda: ba.make_alrkvd(B, L, H, D, T, *ba.VARIANTS[args.variant], dev, gen)  # noqa: E731
        first, nbytes = make()
        layers = [first] + [make()[0] for _ in range(ba.num_copies(nbytes, dev) - 1)]
        # kernels before the values' codes were stored token-contiguous (2026-12-03) read them row-major (a no-op
        # for the layouts they had); `+kt` arms read the keys' codes token-major
        before_layers = ([row_major(kw, "v_resid") if args.before_values_row_major else kw for kw in layers]
                         if before is not None else [])
        kt_layers = [row_major(kw, "k_resid") for kw in layers] if any(n.endswith("+kt") for n in arms) else []
        q = torch.randn(B, Hq, D, device=dev, dtype=torch.float16)
        for rep in (1, 2):
            for name, overrides in arms.items():
                mod = files[name] if name in files else before if overrides is None else now
                now._DEFAULT_STAGE1.clear()
                now._DEFAULT_STAGE1.update(default_cfg, **(overrides if isinstance(overrides, dict) else {}))
                paged._RESIDENT.clear()
                known = stage1_builds(mod)
                try:
                    arm_layers = before_layers if overrides is None else kt_layers if name.endswith("+kt") else layers
                    checked = rep == 1 and B * L <= args.check_tokens
                    err = ba.check_decode_kernel(mod.alrkvd_decode_attention, now.alrkvd_decode_attention_ref, q,
                                                 scale, **arm_layers[0])[1] if checked else {}
                    us = ba.time_calls([lambda kw=kw: mod.alrkvd_decode_attention(q, scale=scale, **kw)
                                        for kw in arm_layers], dev) * 1e6
                except Exception as exc:  # noqa: BLE001 - an arm that does not compile is reported, not fatal
                    print(f"{B:>3} {L:>7} {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                resident = sorted(set(paged._RESIDENT.values()))
                builds = sorted(stage1_builds(mod) - known)  # (warps, registers, spills, shared) of new builds
                rows.append(dict(B=B, L=L, rep=rep, arm=name, us=us, sdpa_us=sdpa, vs_sdpa=sdpa / us,
                                 bytes=nbytes, resident=resident, builds=builds, **err))
                print(f"{B:>3} {L:>7} {rep} {name:<14} resident {resident} {us:9.1f} us  vs sdpa {sdpa / us:.2f} "
                      f"{err.get('check_ok', '')} {builds or ''}", flush=True)
        del layers, before_layers, kt_layers, first
        torch.cuda.empty_cache()
    now._DEFAULT_STAGE1.clear()
    now._DEFAULT_STAGE1.update(default_cfg)
    Path(args.out).write_text(json.dumps(dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=torch.cuda.get_device_name(), triton=__import__("triton").__version__, torch=torch.__version__,
        variant=args.variant, arms=args.arms, before=args.before, rows=rows), indent=1))
    print(f"\nus (best of two), {args.variant}")
    print(f"{'B':>3} {'L':>7} {'sdpa':>8} " + " ".join(f"{n:>14}" for n in arms))
    for B, L in shapes:
        cells = [min((r["us"] for r in rows if (r["B"], r["L"], r["arm"]) == (B, L, n)), default=float("nan"))
                 for n in arms]
        sd = next((r["sdpa_us"] for r in rows if (r["B"], r["L"]) == (B, L)), float("nan"))
        print(f"{B:>3} {L:>7} {sd:8.1f} " + " ".join(f"{c:14.1f}" for c in cells))
    return 1 if any(r.get("check_ok") is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
