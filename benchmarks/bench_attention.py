"""Decode attention on the GPU: our Triton kernels against FP16 SDPA (flash), timed in one run.

For each batch B and context L (32 query / 8 kv heads, head_dim 128, one query token):
  sdpa        torch.nn.functional.scaled_dot_product_attention, flash backend, fp16, enable_gqa=True,
              contiguous K/V [B, 8, L, 128] (the baseline)
  paged-fp16  kernels.paged_attention over the same keys/values in the paged fp16 cache (block 16)
  alrkvd-*    kernels.alrkvd_attention over a synthetic ALR-KVD cache in the layout it reads (block 128,
              2-bit uniform residual with one fp16 scale and zero per token and head, 8-bit latents and
              basis): per-head ranks 16, 32, 64 and a mixed allocation; alrkvd-<ranks> with the low-rank keys
              before RoPE (key_frame=post_rope), alrkvd-rot-<ranks> with the whole key after it (rotated)
  kivi2/4     kernels.kivi_attention over a synthetic KIVI cache (block 128, groups of 32, 2 or 4 bits)
Each row gives the time, the bytes the method must read (K/V, or every byte of the compressed blocks),
the bandwidth achieved and its fraction of the device-to-device copy bandwidth measured in this run.

Timing: CUDA graphs of several calls over distinct copies of the data (enough copies to exceed the L2
cache, so reads come from HBM), replayed and timed with CUDA events; no CPU launch cost is counted
(the engine replays decode steps as graphs too). A failing row is printed and skipped.

--compare-with FILE.py times another copy of kernels/alrkvd_attention.py (an earlier commit's: `git show
REV:kernels/alrkvd_attention.py > FILE.py`; its kernels.* imports resolve to this tree) on the same data as each
ALR-KVD row, interleaved with this tree's kernel (before, after, after, before; each arm's best of two), and adds
before_us, after_us, ratio (after / before) and the largest difference of their outputs to the row. Without --tune.

    python benchmarks/bench_attention.py --out reports/bench_attention.json        # H200, ~2-4 min
    TRITON_INTERPRET=1 python benchmarks/bench_attention.py --smoke               # CPU, tiny shapes (CI)
"""
from __future__ import annotations

import argparse
import datetime
import functools
import importlib.util
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.devices import copy_bandwidth  # noqa: E402
from kernels.testing import check_decode_kernel, rope_tables, use_interpreter_without_gpu  # noqa: E402

DEVICE = use_interpreter_without_gpu()  # before the kernel modules: Triton decides at @jit time

import triton  # noqa: E402

import kernels.alrkvd_attention as alrkvd_mod  # noqa: E402
import kernels.paged_attention as paged_mod  # noqa: E402
from kernels.kivi_attention import KiviLayer, kivi_decode_attention, kivi_decode_attention_ref  # noqa: E402
from kernels.alrkvd_attention import AlrkvdLayer, alrkvd_decode_attention, alrkvd_decode_attention_ref  # noqa: E402
from kernels.paged_attention import paged_decode_attention  # noqa: E402

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
FP16_BLOCK, ALRKVD_BLOCK = 16, 128
# per-stream ranks of the 8 kv heads: keys, values
RANKS = {
    "r16": ([16] * 8, [16] * 8),
    "r32": ([32] * 8, [32] * 8),
    "r64": ([64] * 8, [64] * 8),
    "mixed": ([8, 16, 24, 32, 32, 40, 48, 56], [56, 48, 40, 32, 32, 24, 16, 8]),
}
# alrkvd-<ranks>: low-rank keys before RoPE, rotated in the kernel (key_frame=post_rope: the residual after it);
# alrkvd-rot-<ranks>: the whole key compressed after RoPE (key_frame=rotated), no RoPE in the kernel's loop
VARIANTS = {f"alrkvd-{prefix}{name}": (*ranks, frame) for prefix, frame in (("", "post_rope"), ("rot-", "rotated"))
            for name, ranks in RANKS.items()}
KIVI_VARIANTS = {"kivi2": 2, "kivi4": 4}  # KIVI (kernels/kivi_attention.py) at these bits


# ------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------
def time_calls(calls, device, min_total_s: float = 0.1) -> float:
    """Seconds per call, averaged over `calls` (each over its own data), from CUDA-graph replays."""
    if device != "cuda":
        t = time.perf_counter()
        for c in calls:
            c()
        return (time.perf_counter() - t) / len(calls)
    for c in calls:  # compile and warm up outside the capture
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:
            c()
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    once = start.elapsed_time(end) / 1e3
    reps = max(3, min(200, int(min_total_s / max(once, 1e-6))))
    samples = []
    for _ in range(5):
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / reps)
    return sorted(samples)[len(samples) // 2] / len(calls)


def num_copies(bytes_per_call: int, device) -> int:
    """Distinct data copies so that one graph's reads exceed twice the L2 cache (cold reads)."""
    if device != "cuda":
        return 1
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20)
    return max(1, min(16, math.ceil(2 * l2 / max(bytes_per_call, 1))))


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------
def make_alrkvd(batch, length, num_kv_heads, head_dim, block, ranks_k, ranks_v, key_frame, device, gen, k_bits=2,
                v_bits=2):
    """A synthetic ALR-KVD layer (random codes; speed does not depend on values) holding `batch`
    sequences of `length` tokens in closed blocks, in the format's own storage layout
    (backend.kv_formats.ALRKVDFormat with the kernel's options). Returns (kwargs of the kernel, bytes read)."""
    from backend.kv_formats import make_format
    from kernels.alrkvd_attention import kernel_options
    assert length % block == 0
    H, D, T = num_kv_heads, head_dim, block
    nb = batch * length // T
    ranks = torch.tensor(ranks_k[:H] + ranks_v[:H], dtype=torch.int16)
    R = int(ranks.sum())
    fmt = make_format("alrkvd", 1, H, D, torch.float16, device, num_blocks=nb, block_size=T,
                      **kernel_options(D, k_bits=k_bits, v_bits=v_bits, rank_budget=R, rank_min=0, key_frame=key_frame,
                                       rank_max=max(max(ranks_k[:H]), max(ranks_v[:H]))))
    fmt.ranks.copy_(ranks.to(device).expand_as(fmt.ranks))
    for t in (fmt.basis, fmt.latent, fmt.k_resid, fmt.v_resid):  # on the device: gigabytes at B=32, L=128k
        t.random_(-127, 128) if t.dtype == torch.int8 else t.random_(0, 256)
    for t, value in ((fmt.basis_scale, 1 / (127 * math.sqrt(D) / 4)), (fmt.latent_scale, 2 / 255),
                     (fmt.latent_zero, -1.0), (fmt.k_rscale, 0.1), (fmt.k_rzero, -0.15), (fmt.v_rscale, 0.1),
                     (fmt.v_rzero, -0.15)):
        t.fill_(value)
    kwargs = _windowed_inputs(AlrkvdLayer.from_format(fmt, 0), batch, length, device, gen)
    return dict(kwargs, **vars(rope_tables(D, length, 1e6, device))), nb * fmt.bytes_per_block()


def make_kivi(batch, length, num_kv_heads, head_dim, block, bits, device, gen):
    """A synthetic KIVI layer (random codes, backend.kv_formats.KIVIFormat's layout) holding `batch` sequences
    of `length` tokens in closed blocks. Returns (kwargs of the kernel, bytes read)."""
    from backend.kv_formats import make_format
    assert length % block == 0
    nb = batch * length // block
    fmt = make_format(f"kivi{bits}", 1, num_kv_heads, head_dim, torch.float16, device, num_blocks=nb,
                      block_size=block)
    for t in (fmt.k_codes, fmt.v_codes):
        t.random_(0, 256)
    for t, value in ((fmt.k_scale, 0.1), (fmt.k_zero, -0.15), (fmt.v_scale, 0.1), (fmt.v_zero, -0.15)):
        t.fill_(value)
    return _windowed_inputs(KiviLayer.from_format(fmt, 0), batch, length, device, gen), nb * fmt.bytes_per_block()


def _windowed_inputs(layer, batch, length, device, gen) -> dict:
    """A windowed kernel's inputs: `batch` sequences of `length` tokens at random blocks of `layer`, their
    last block in an (empty) window slot, as the cache leaves a full last block."""
    T, H, D = layer.block_size, layer.num_kv_heads, layer.head_dim
    nb = batch * length // T
    perm = torch.randperm(nb, generator=gen).int()
    block_tables = torch.cat([perm.view(batch, -1), torch.zeros(batch, 1, dtype=torch.int32)], 1)
    window = torch.zeros(batch + 1, T, H, D, dtype=torch.float16, device=device)
    return dict(cache=layer, window_k=window, window_v=window.clone(), block_tables=block_tables.to(device),
                seq_lens=torch.full((batch,), length, dtype=torch.int32, device=device),
                window_slots=torch.arange(batch, dtype=torch.int32, device=device))


def make_paged_fp16(k, v, block, gen):
    """The paged fp16 cache [num_blocks, block, H, D] holding SDPA's k, v [B, H, L, D] at random blocks."""
    batch, heads, length, dim = k.shape
    nb = batch * length // block
    perm = torch.randperm(nb, generator=gen).to(k.device)
    caches = []
    for x in (k, v):
        paged = torch.empty(nb, block, heads, dim, dtype=x.dtype, device=x.device)
        paged[perm] = x.transpose(1, 2).reshape(nb, block, heads, dim)
        caches.append(paged)
    return caches[0], caches[1], perm.int().view(batch, -1).contiguous()


# ------------------------------------------------------------------------------------------------
# Runs
# ------------------------------------------------------------------------------------------------
def load_kernel_copy(path: str):
    """A second copy of the ALR-KVD kernel module, from a file (--compare-with)."""
    spec = importlib.util.spec_from_file_location("alrkvd_attention_compared", path)
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclass looks itself up there
    spec.loader.exec_module(mod)
    return mod


def compare_arms(before_kernel, after_kernel, q, scale, layers, device) -> dict:
    """Two kernels on the same `layers`, timed interleaved (before, after, after, before), each arm's best of two.
    Each arm finds its own split count: the cache of programs resident per SM, keyed alike for both copies, is
    cleared before each, and what the arm found is recorded (resident_*: a register change would show there)."""
    times, resident = {"before": [], "after": []}, {}
    for arm in ("before", "after", "after", "before"):
        kernel = before_kernel if arm == "before" else after_kernel
        paged_mod._RESIDENT.clear()
        times[arm].append(time_calls([lambda kw=kw: kernel(q, scale=scale, **kw) for kw in layers], device))
        resident[arm] = sorted(set(paged_mod._RESIDENT.values()))
    paged_mod._RESIDENT.clear()
    out_before = before_kernel(q, scale=scale, **layers[0]).float()
    paged_mod._RESIDENT.clear()
    diff = (after_kernel(q, scale=scale, **layers[0]).float() - out_before).abs().max().item()
    before, after = min(times["before"]), min(times["after"])
    return dict(before_us=before * 1e6, after_us=after * 1e6, ratio=after / before, max_diff_vs_before=diff,
                resident_before=resident["before"], resident_after=resident["after"])


def sdpa_call(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = [SDPBackend.FLASH_ATTENTION] if q.is_cuda else [SDPBackend.MATH]

    def call():
        with sdpa_kernel(backends):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return call


def bench_config(batch, length, variants, args, device, copy_bw, gen):
    rows = []
    Hq, Hkv, D = args.num_q_heads, args.num_kv_heads, args.head_dim
    scale = D ** -0.5
    kv_bytes = 2 * batch * Hkv * length * D * 2

    def record(method, sec, nbytes, **extra):
        row = dict(B=batch, L=length, method=method, us=sec * 1e6, bytes=nbytes, GBps=nbytes / sec / 1e9,
                   frac_copy=nbytes / sec / copy_bw, **extra)
        rows.append(row)
        print_row(row, rows[0] if rows[0]["method"] == "sdpa" else None)

    def failed(method, exc):
        rows.append(dict(B=batch, L=length, method=method, error=f"{type(exc).__name__}: {exc}"))
        print(f"{batch:>3} {length:>7} {method:<18} FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        if args.verbose:
            traceback.print_exc()

    # -- fp16 contiguous (SDPA) and the same data paged (our fp16 kernel)
    n = num_copies(kv_bytes, device)
    sdpa_out = None
    try:
        data = []
        for _ in range(n):
            q = torch.randn(batch, Hq, 1, D, generator=None, device=device, dtype=torch.float16)
            k = torch.randn(batch, Hkv, length, D, device=device, dtype=torch.float16)
            v = torch.randn(batch, Hkv, length, D, device=device, dtype=torch.float16)
            data.append((q, k, v))
        sdpa_out = sdpa_call(*data[0])()
        record("sdpa", time_calls([sdpa_call(*d) for d in data], device), kv_bytes)
    except Exception as exc:  # noqa: BLE001 - one failed row must not end the table
        failed("sdpa", exc)
        data = []
    try:
        if not data:
            raise RuntimeError("no fp16 data (sdpa setup failed)")
        paged = []
        for q, k, v in data:
            kc, vc, bt = make_paged_fp16(k, v, FP16_BLOCK, gen)
            paged.append((q[:, :, 0], kc, vc, bt, torch.full((batch,), length, dtype=torch.int32, device=device)))
        del data
        out = paged_decode_attention(*paged[0], scale)
        err = (out.float() - sdpa_out[:, :, 0].float()).abs().max().item() if sdpa_out is not None else float("nan")
        calls = [lambda p=p: paged_decode_attention(*p, scale) for p in paged]
        record("paged-fp16", time_calls(calls, device), kv_bytes + batch * length // FP16_BLOCK * 4,
               max_err_vs_sdpa=err)
        del paged, calls
    except Exception as exc:  # noqa: BLE001
        failed("paged-fp16", exc)
    data = paged = None
    if device == "cuda":
        torch.cuda.empty_cache()

    # -- ALR-KVD and KIVI
    for name in variants:
        if name in KIVI_VARIANTS:
            make = functools.partial(make_kivi, batch, length, Hkv, D, args.block, KIVI_VARIANTS[name], device, gen)
            kernel, kernel_ref = kivi_decode_attention, kivi_decode_attention_ref
        else:
            make = functools.partial(make_alrkvd, batch, length, Hkv, D, args.block, *VARIANTS[name], device, gen)
            kernel, kernel_ref = alrkvd_decode_attention, alrkvd_decode_attention_ref
        try:
            q = torch.randn(batch, Hq, D, device=device, dtype=torch.float16)
            first, nbytes = make()
            layers = [first] + [make()[0] for _ in range(num_copies(nbytes, device) - 1)]
            extra = {}
            if args.check and batch * length <= args.check_tokens:
                extra = check_decode_kernel(kernel, kernel_ref, q, scale, **first)[1]
            if args.compare_kernel and name not in KIVI_VARIANTS:  # this row's time: this tree's kernel, the after
                extra.update(compare_arms(args.compare_kernel, kernel, q, scale, layers, device))
                record(name, extra["after_us"] / 1e6, nbytes, **extra)
            else:
                calls = [lambda kw=kw: kernel(q, scale=scale, **kw) for kw in layers]
                record(name, time_calls(calls, device), nbytes, **extra)
                del calls
            del layers, first
        except Exception as exc:  # noqa: BLE001
            failed(name, exc)
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


# Launch configurations tried by --tune (stage 1 of each kernel), at B=8, L=32k.
TUNE_SPACE = {
    "paged_decode_stage1": [dict(BLOCK_N=n, num_warps=w, num_stages=st)
                            for n, w, st in [(32, 4, 2), (32, 8, 2), (64, 8, 2), (64, 8, 3), (128, 8, 2)]],
    # one warp count at every batch (NUM_WARPS_MANY_PAIRS is left out); MIN_TOKENS_PER_SPLIT 128 as the default, the
    # window's tile as the defaults give it (64 at 2 warps, else 128; BENCHMARKS.md section 2r)
    "alrkvd_decode_stage1": [dict(BLOCK_N=n, WINDOW_N=64 if w == 2 else 128, num_warps=w, num_stages=2,
                                  MIN_TOKENS_PER_SPLIT=128)
                             for n, w in [(32, 2), (64, 2), (128, 2), (32, 4), (64, 4), (128, 4), (64, 8), (128, 8)]],
}


def tune(args, device, gen, shapes=((8, 32768),)):
    """Time each launch configuration of TUNE_SPACE at each (batch, length) of `shapes` (ALR-KVD: --tune-variant);
    install the best over all shapes as the kernels' default for the rest of the run. Returns
    {kernel: {best, results: [{config, B, L, us | error}]}}."""
    Hq, Hkv, D = args.num_q_heads, args.num_kv_heads, args.head_dim
    scale = D ** -0.5
    report = {kernel: {"results": []} for kernel in TUNE_SPACE}
    defaults = {"paged_decode_stage1": paged_mod._DEFAULT_STAGE1, "alrkvd_decode_stage1": alrkvd_mod._DEFAULT_STAGE1}
    originals = {kernel: dict(d) for kernel, d in defaults.items()}
    for batch, length in shapes:
        q = torch.randn(batch, Hq, D, device=device, dtype=torch.float16)
        k = torch.randn(batch, Hkv, length, D, device=device, dtype=torch.float16)
        kc, vc, bt = make_paged_fp16(k, torch.randn_like(k), FP16_BLOCK, gen)
        del k
        seq_lens = torch.full((batch,), length, dtype=torch.int32, device=device)
        alr, _ = make_alrkvd(batch, length, Hkv, D, args.block, *VARIANTS[args.tune_variant], device, gen)
        calls = {
            "paged_decode_stage1": lambda: paged_decode_attention(q, kc, vc, bt, seq_lens, scale),
            "alrkvd_decode_stage1": lambda: alrkvd_decode_attention(q, scale=scale, **alr),
        }
        for kernel, call in calls.items():
            for cfg in TUNE_SPACE[kernel]:
                defaults[kernel].clear()
                defaults[kernel].update(cfg)
                row = {"config": cfg, "B": batch, "L": length}
                try:
                    row["us"] = time_calls([call], device) * 1e6
                except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory: skip the config
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                report[kernel]["results"].append(row)
                print(f"tune {kernel:<22} B={batch} L={length} {cfg} -> {row.get('us', row.get('error'))}", flush=True)
            defaults[kernel].clear()
            defaults[kernel].update(originals[kernel])
        del kc, vc, alr
        if device == "cuda":
            torch.cuda.empty_cache()
    for kernel, rep in report.items():
        # best over every shape: the smallest product of (time / the shape's fastest time); configs that
        # failed at some shape are out
        fastest = {}
        for r in rep["results"]:
            if "us" in r:
                fastest[r["B"], r["L"]] = min(r["us"], fastest.get((r["B"], r["L"]), float("inf")))
        score = {}
        for r in rep["results"]:
            key = json.dumps(r["config"], sort_keys=True)
            score[key] = score.get(key, 1.0) * (r["us"] / fastest[r["B"], r["L"]] if "us" in r else float("inf"))
        best = min(score, key=score.get) if score else None
        rep["best"] = json.loads(best) if best and score[best] < float("inf") else originals[kernel]
        defaults[kernel].clear()
        defaults[kernel].update(rep["best"])
        print(f"tune {kernel:<22} best over {list(shapes)}: {rep['best']}", flush=True)
    return report


def print_header():
    print(f"{'B':>3} {'L':>7} {'method':<18} {'time us':>10} {'MB read':>10} {'GB/s':>8} {'%copy':>6} "
          f"{'vs sdpa':>8}  check", flush=True)


def print_row(row, sdpa_row):
    speed = f"{sdpa_row['us'] / row['us']:.2f}x" if sdpa_row else "-"
    check = ""
    if "max_err_vs_sdpa" in row:
        check = f"err vs sdpa {row['max_err_vs_sdpa']:.2e}"
    if "check_ok" in row:
        check = f"{'ok' if row['check_ok'] else 'MISMATCH'} err {row['max_err_vs_ref']:.2e} (fp16 {row['fp16_rounding_err']:.2e})"
    if "ratio" in row:
        check += (f"  before {row['before_us']:.1f} after {row['after_us']:.1f} us ratio {row['ratio']:.3f}"
                  f" diff {row['max_diff_vs_before']:.1e} resident {row['resident_before']} {row['resident_after']}")
    print(f"{row['B']:>3} {row['L']:>7} {row['method']:<18} {row['us']:>10.1f} {row['bytes'] / 1e6:>10.1f} "
          f"{row['GBps']:>8.0f} {100 * row['frac_copy']:>5.0f}% {speed:>8}  {check}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="write the results as JSON to this path")
    p.add_argument("--smoke", action="store_true", help="tiny shapes (CPU under TRITON_INTERPRET=1 in CI)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 32768, 131072])
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS) + list(KIVI_VARIANTS),
                   help="default: all (with --smoke: alrkvd-r16 alrkvd-mixed alrkvd-rot-r16 kivi4)")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip the ALR-KVD check against the PyTorch reference on the small configs")
    p.add_argument("--check-tokens", type=int, default=8192, help="check configs with B*L up to this")
    p.add_argument("--tune", action=argparse.BooleanOptionalAction, default=None,
                   help="sweep the kernels' launch configurations first (default: on with a GPU)")
    p.add_argument("--tune-shapes", type=lambda s: tuple(int(x) for x in s.split("x")), nargs="+",
                   default=[(8, 32768)], metavar="BxL",
                   help="shapes the sweep times (the best config over all of them is used): e.g. 8x32768 1x4096")
    p.add_argument("--tune-variant", default="alrkvd-r16", choices=list(VARIANTS), help="the ALR-KVD cache the sweep times")
    p.add_argument("--compare-with", metavar="FILE.py",
                   help="time this copy of kernels/alrkvd_attention.py against this tree's on each ALR-KVD row")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.compare_with and args.tune:
        p.error("--compare-with times both kernels with their default launches: leave out --tune")
    args.num_q_heads, args.num_kv_heads, args.head_dim, args.block = NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, ALRKVD_BLOCK
    if args.smoke:
        args.batches, args.lengths = [2], [192]
        args.num_q_heads, args.num_kv_heads, args.head_dim, args.block = 8, 2, 64, 64  # block >= the mixed ranks
        args.variants = args.variants or ["alrkvd-r16", "alrkvd-mixed", "alrkvd-rot-r16", "kivi4"]
    args.variants = args.variants or list(VARIANTS) + list(KIVI_VARIANTS)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = DEVICE
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if device == "cuda" else f"cpu ({platform.processor() or platform.machine()}, TRITON_INTERPRET=1)",
        "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
        "cuda": torch.version.cuda, "num_q_heads": args.num_q_heads, "num_kv_heads": args.num_kv_heads,
        "head_dim": args.head_dim, "fp16_block": FP16_BLOCK, "alrkvd_block": args.block,
        "interpreter": os.environ.get("TRITON_INTERPRET") == "1", "compare_with": args.compare_with,
    }
    print(" ".join(f"{k}={v}" for k, v in meta.items()), flush=True)
    gen = torch.Generator().manual_seed(0)  # block permutations (CPU); device data from torch.manual_seed
    torch.manual_seed(0)
    t0 = time.perf_counter()
    copy_bw = copy_bandwidth(device)
    meta["copy_GBps"] = copy_bw / 1e9
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + write)", flush=True)
    args.compare_kernel = load_kernel_copy(args.compare_with).alrkvd_decode_attention if args.compare_with else None
    if args.tune or (args.tune is None and device == "cuda" and not args.compare_with):
        meta["tuning"] = tune(args, device, gen, [(2, 192)] if args.smoke else args.tune_shapes)
    print_header()
    rows = []
    for batch in args.batches:
        for length in args.lengths:
            rows += bench_config(batch, length, args.variants, args, device, copy_bw, gen)
    meta["wall_s"] = time.perf_counter() - t0
    print(f"done in {meta['wall_s']:.0f} s", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    failed = [r for r in rows if "error" in r or r.get("check_ok") is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
