"""Expert streaming on the GPU: MoE decode with the experts in pinned host memory and a device cache
of 25%, 50% or 100% of them, against the host-to-device link measured in the same run.

Dummy weights in the shapes of Mixtral-8x7B (32 layers, hidden 4096, 8 experts top-2, intermediate
14336) and Qwen3-30B-A3B (48 layers, hidden 2048, 128 experts top-8, moe_intermediate 768), bf16.
A slice of each model's MoE layers is built (the whole experts of Mixtral are 90 GB: too long to
draw and pin in the run); every layer of the slice is the real `backend.model.MoE` (router, top-k)
with its experts served by `backend.experts.ExpertCache` (fused Triton MoE over the slot table,
prefetch by pre-gating on the copy stream), and a decode step runs x <- x + MoE(rms_norm(x)) through
the slice; attention is left out (its time does not depend on the expert budget). Routers are
dummy too: routing is close to uniform and independent from token to token, the worst case for a
cache (the hit rate of any policy is about the budget fraction) and for prediction.

Per (model, budget, batch) row: decode time per step (each sequence gets one token), per MoE layer
and extrapolated to the model's layers; hit rate; prefetch precision and recall; bytes streamed
per token; compute-stream stall per step; the bandwidth the copies reached while running (bytes /
time of the copy batches on the copy stream) against the pinned host-to-device bandwidth measured
first; the link-bound floor (bytes streamed per step / that bandwidth) and how close the step came
to it; and whether the final hidden states are bit-identical to the all-resident run (the same
kernel over the same weights: any race between copies and compute would show).

With `--graphs`, each row instead replays the slice's step as a CUDA graph: the experts streamed by
`backend.graph_experts.DeviceExpertCache` (every decision on the device, copies by the kernel that reads
pinned host memory) against the slice with every expert resident, also replayed as a graph; routing
`uniform` (the dummy routers) or `local` (seeded tables with the SmolLM2 MoE's load skew and reuse,
`backend.model.local_routes`, a row's consecutive steps in consecutive buckets). The copy kernel's own
bandwidth over the link is measured beside `cudaMemcpyAsync`'s.

    python benchmarks/bench_experts.py --out reports/bench_experts.json       # H200, ~2-3 min
    python benchmarks/bench_experts.py --graphs --out reports/graph_experts.json   # H200
    python benchmarks/bench_experts.py --smoke --out /tmp/bench_experts.json  # CPU, tiny shapes (CI)
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels.testing import use_interpreter_without_gpu  # noqa: E402

DEVICE = use_interpreter_without_gpu()

import triton  # noqa: E402

from backend.config import ModelConfig  # noqa: E402
from backend.engine import LOCALITY, PREGATING_RECALL  # noqa: E402
from backend.experts import ExpertCache, ExpertStore  # noqa: E402
from backend.graph_experts import DeviceExpertCache  # noqa: E402
from backend.model import MoE, blur_routes, local_routes  # noqa: E402
from kernels.expert_copy import copy_rows  # noqa: E402

# name: (HF config fields, MoE layers benchmarked)
MODELS = {
    "mixtral-8x7b": (dict(model_type="mixtral", vocab_size=32000, hidden_size=4096, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                          num_local_experts=8, num_experts_per_tok=2), 6),
    "qwen3-30b-a3b": (dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, num_hidden_layers=48,
                           num_attention_heads=32, num_key_value_heads=4, head_dim=128, intermediate_size=6144,
                           moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                           norm_topk_prob=True), 12),
}
SMOKE_MODEL = (dict(model_type="qwen3_moe", vocab_size=256, hidden_size=64, num_hidden_layers=24,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                    moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True), 4)
LINK_GBPS_REFERENCE = 55.3  # pinned host-to-device, measured on this H200 before (docs: shared/gpu)


# ------------------------------------------------------------------------------------------------
# Measurements
# ------------------------------------------------------------------------------------------------
def _median_seconds(fn, reps: int = 5) -> float:
    """Median time of `fn()` on the current CUDA stream, timed with events, after one untimed call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def h2d_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """Pinned host-to-device copy, bytes per second (median of 5)."""
    if device != "cuda":
        return 0.0
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return nbytes / _median_seconds(lambda: dst.copy_(src, non_blocking=True))


def copy_kernel_bandwidth(store: ExpertStore, device: str, experts: int = 32) -> dict:
    """Bytes per second of `copy_rows` bringing `experts` of the store's first layer from pinned host memory,
    per block size (elements per program)."""
    if device != "cuda":
        return {}
    return {block: _copy_kernel_bandwidth(store, device, experts, block) for block in (2048, 8192, 32768)}


def _copy_kernel_bandwidth(store: ExpertStore, device: str, experts: int, block: int) -> float:
    src = store.w13[store.layers[0]]
    n = min(experts, src.shape[0])
    dst = torch.empty((n, *src.shape[1:]), dtype=src.dtype, device=device)
    rows = torch.arange(n, device=device)
    valid = torch.ones(n, dtype=torch.bool, device=device)
    return dst.nbytes / _median_seconds(lambda: copy_rows(src, dst, rows, rows, valid, block))


class MoESlice(nn.Module):
    """MoE sublayers of consecutive decoder layers: x <- x + MoE(rms_norm(x)) each."""

    def __init__(self, cfg: ModelConfig, num_layers: int, device, dtype, seed: int):
        super().__init__()
        with torch.device("meta"):
            self.moes = nn.ModuleList(MoE(cfg) for _ in range(num_layers))
        g = torch.Generator(device=device).manual_seed(seed)
        H, E = cfg.hidden_size, cfg.num_experts
        for moe in self.moes:
            del moe.w13, moe.w2  # served by the expert cache
            moe.gate = nn.Linear(H, E, bias=False, device=device, dtype=dtype)
            # as the loader's dummy format: U(-1, 1)/sqrt(fan_in), routers x4 for peakier routing
            moe.gate.weight.data.uniform_(-1, 1, generator=g).mul_(4.0 / H ** 0.5)
        self.hidden = H

    def route_locally(self, batch: int, seed: int):
        """Seeded routing tables with a trained router's locality (`local_routes`) and predictability from the
        previous layer (`blur_routes`); `self.keys` [batch] holds each row's bucket, advanced by one per step
        (`next_keys`)."""
        device = self.moes[0].gate.weight.device
        self.keys = torch.arange(batch, device=device) * 104729 % 4096  # one tensor: every layer's keys advance
        for i, moe in enumerate(self.moes):
            E = moe.gate.out_features
            routes = local_routes(E, moe.top_k, 4096, *LOCALITY, seed=seed * 1009 + i)
            moe.seeded_routes = routes.to(device)
            moe.predicted_routes = blur_routes(routes, E, PREGATING_RECALL, seed * 1009 + i + 1).to(device)
            moe.route_keys = self.keys

    def route_by_router(self):
        for moe in self.moes:
            moe.seeded_routes = moe.predicted_routes = moe.route_keys = None

    def next_keys(self):
        if self.moes[0].seeded_routes is not None:
            self.keys.add_(1).remainder_(4096)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for moe in self.moes:
            x = x + moe(F.rms_norm(x, (self.hidden,), eps=1e-6))
        return x


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def bench_row(model: MoESlice, store: ExpertStore, cfg: ModelConfig, fraction: float, batch: int,
              prefetch: int, policy: str, steps: int, warmup: int, device: str, link_bps: float,
              reference: dict) -> dict:
    L = len(store.layers)
    slots = max(1, round(fraction * cfg.num_experts))
    budget = slots * store.expert_bytes * L
    routers = {i: moe.prefetch_logits for i, moe in enumerate(model.moes)}
    cache = ExpertCache(store, routers, cfg.num_experts_per_tok, budget, device, prefetch, policy)
    for i, moe in enumerate(model.moes):
        moe.experts = cache.layer(i)
    g = torch.Generator(device=device).manual_seed(1234)
    dtype = store.dtype
    inputs = [torch.randn(batch, cfg.hidden_size, generator=g, device=device).to(dtype)
              for _ in range(warmup + steps)]
    for x in inputs[:warmup]:  # compile, fill the cache
        model(x)
    cache.reset_stats()
    step_s = []
    for x in inputs[warmup:]:
        t0 = time.perf_counter()
        out = model(x)
        sync(device)
        step_s.append(time.perf_counter() - t0)
    cache.synchronize()
    st = cache.stats()
    step = statistics.median(step_s)
    streamed_per_step = st["expert_bytes_streamed"] / steps
    floor = streamed_per_step / link_bps if link_bps else 0.0
    key = (batch,)
    if fraction >= 1.0 and prefetch == 1 and policy == "lru":
        reference[key] = (out.clone(), step)
    ref_out, ref_step = reference.get(key, (None, None))
    row = {
        "budget": fraction, "batch": batch, "prefetch": prefetch, "policy": policy,
        "slots_per_layer": cache.slots_per_layer, "cache_GB": cache.nbytes / 1e9,
        "step_ms": step * 1e3, "step_ms_p90": sorted(step_s)[int(0.9 * (len(step_s) - 1))] * 1e3,
        "layer_ms": step / L * 1e3,
        "model_step_ms": step / L * cfg.num_layers * 1e3,  # extrapolated to all MoE layers
        "vs_resident": step / ref_step if ref_step else None,
        "hit_rate": st["expert_hit_rate"],
        "prefetch_precision": st["expert_prefetch_precision"], "prefetch_recall": st["expert_prefetch_recall"],
        "MB_per_token": st["expert_bytes_per_token"] / 1e6,
        "MB_per_step": streamed_per_step / 1e6,
        "stall_ms_per_step": st["expert_stall_s"] / steps * 1e3,
        "copy_GBps": st["expert_copy_gbps"],
        "link_util": st["expert_copy_gbps"] * 1e9 / link_bps if link_bps else None,
        "link_busy": st["expert_copy_s"] / sum(step_s),
        "floor_ms": floor * 1e3, "vs_floor": step / floor if floor else None,
        "exact_vs_resident": bool(torch.equal(out, ref_out)) if ref_out is not None else None,
    }
    del cache
    for moe in model.moes:
        moe.experts = None
    return row


@torch.inference_mode()
def bench_graph_row(model: MoESlice, store: ExpertStore, cfg: ModelConfig, fraction: float, batch: int,
                    routing: str, decisions: str, steps: int, warmup: int, device: str, link_bps: float,
                    reference: dict) -> dict:
    """One row of `--graphs`: the slice's step replayed as a CUDA graph (on the CPU: the same static
    buffers run eagerly), all experts resident (fraction 1) or streamed by a `DeviceExpertCache`; with
    `decisions` "host", streamed by the host-decided `ExpertCache` in eager steps (the former path)."""
    L, E = len(store.layers), cfg.num_experts
    if routing == "local":
        model.route_locally(batch, seed=2)
    else:
        model.route_by_router()
    cache = None
    if fraction >= 1.0:
        for li, moe in zip(store.layers, model.moes):
            moe.w13, moe.w2 = store.w13[li].to(device), store.w2[li].to(device)
    else:
        budget = max(1, round(fraction * E)) * store.expert_bytes * L
        routers = {i: m.prefetch_logits for i, m in enumerate(model.moes)}
        kind = DeviceExpertCache if decisions == "device" else ExpertCache
        cache = kind(store, routers, cfg.num_experts_per_tok, budget, device)
        for i, moe in enumerate(model.moes):
            moe.experts = cache.layer(i)
    g = torch.Generator(device=device).manual_seed(1234)
    inputs = [torch.randn(batch, cfg.hidden_size, generator=g, device=device).to(store.dtype)
              for _ in range(warmup + steps)]
    static_x = inputs[0].clone()
    graph = None
    if device == "cuda" and decisions == "device":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compile the kernels outside the capture
            model(static_x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(static_x)

    def step(x):
        model.next_keys()
        static_x.copy_(x)
        if graph is None:
            return model(static_x)
        graph.replay()
        return out

    for x in inputs[:warmup]:
        step(x)
    if cache is not None:
        cache.reset_stats()
    step_s = []
    for x in inputs[warmup:]:
        sync(device)
        t0 = time.perf_counter()
        result = step(x)
        sync(device)
        step_s.append(time.perf_counter() - t0)
    step_t = statistics.median(step_s)
    key = (batch, routing)
    if cache is None:
        reference[key] = (result.clone(), step_t)
    ref_out, ref_step = reference.get(key, (None, None))
    row = {"budget": fraction, "batch": batch, "routing": routing, "decisions": decisions, "graph": graph is not None,
           "slots_per_layer": cache.slots_per_layer if cache else E,
           "step_ms": step_t * 1e3, "step_ms_p90": sorted(step_s)[int(0.9 * (len(step_s) - 1))] * 1e3,
           "layer_ms": step_t / L * 1e3, "model_step_ms": step_t / L * cfg.num_layers * 1e3,
           "vs_resident": step_t / ref_step if ref_step else None,
           "exact_vs_resident": bool(torch.equal(result, ref_out)) if ref_out is not None else None,
           "max_diff_vs_resident": ((result.float() - ref_out.float()).abs().max().item()
                                    if ref_out is not None else None)}
    if cache is not None:
        st = cache.stats()
        per_step = st["expert_bytes_streamed"] / steps
        floor = per_step / link_bps if link_bps else 0.0
        row.update({"hit_rate": st["expert_hit_rate"], "prefetch_precision": st["expert_prefetch_precision"],
                    "prefetch_recall": st["expert_prefetch_recall"], "MB_per_step": per_step / 1e6,
                    "experts_per_step": (st["expert_misses"] + st["expert_prefetch_copies"]) / steps,
                    "floor_ms": floor * 1e3, "vs_floor": step_t / floor if floor else None,
                    "link_share": floor / step_t})  # the share of the step the link must be busy at full speed
    for moe in model.moes:
        moe.experts = None
        if fraction >= 1.0:
            del moe.w13, moe.w2
    del cache, graph
    return row


def fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec) if isinstance(v, float) else str(v)


ROW_COLUMNS = [("budget", ".2f"), ("batch", ""), ("prefetch", ""), ("policy", ""), ("slots_per_layer", ""),
               ("step_ms", ".2f"), ("layer_ms", ".3f"), ("model_step_ms", ".1f"), ("vs_resident", ".2f"),
               ("hit_rate", ".2f"), ("prefetch_precision", ".2f"), ("prefetch_recall", ".2f"),
               ("MB_per_token", ".1f"), ("stall_ms_per_step", ".2f"), ("copy_GBps", ".1f"), ("link_util", ".2f"),
               ("link_busy", ".2f"), ("floor_ms", ".2f"), ("vs_floor", ".2f"), ("exact_vs_resident", "")]
GRAPH_COLUMNS = [("budget", ".2f"), ("batch", ""), ("routing", ""), ("decisions", ""), ("graph", ""),
                 ("slots_per_layer", ""),
                 ("step_ms", ".2f"), ("model_step_ms", ".1f"), ("vs_resident", ".2f"), ("hit_rate", ".2f"),
                 ("prefetch_precision", ".2f"), ("prefetch_recall", ".2f"), ("experts_per_step", ".1f"),
                 ("MB_per_step", ".1f"), ("floor_ms", ".2f"), ("vs_floor", ".2f"), ("link_share", ".2f"),
                 ("exact_vs_resident", "")]


def print_rows(title: str, rows: list[dict], cols: list[tuple[str, str]]):
    print(f"\n## {title}")
    print("| " + " | ".join(c for c, _ in cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        if "error" in r:
            print(f"| {r['budget']} | {r['batch']} | error: {r['error']} |")
            continue
        print("| " + " | ".join(fmt(r.get(c), spec) if spec else fmt(r.get(c)) for c, spec in cols) + " |")


def run_model(name, hf, num_layers, args, device, link_bps) -> dict:
    cfg = ModelConfig.from_hf(hf)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    t0 = time.perf_counter()
    store = ExpertStore.dummy(range(num_layers), cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size,
                              dtype, pin=device == "cuda", seed=0, device=device)
    build_s = time.perf_counter() - t0
    model = MoESlice(cfg, num_layers, device, dtype, seed=1)
    print(f"{name}: {num_layers} of {cfg.num_layers} MoE layers, {cfg.num_experts} experts top-"
          f"{cfg.num_experts_per_tok}, expert {store.expert_bytes / 1e6:.1f} MB, store "
          f"{store.nbytes / 1e9:.1f} GB pinned, built in {build_s:.1f} s", flush=True)
    fractions = sorted(set(args.budgets) | {1.0}, reverse=True)  # the resident reference first
    if args.graphs:
        grid = [(f, b, routing, "device") for b in args.batches for routing in ("local", "uniform") for f in fractions]
        grid += [(0.5, b, routing, "host") for b in args.batches for routing in ("local", "uniform")]
    else:
        grid = [(f, b, 1, "lru") for b in args.batches for f in fractions]
        grid += [(0.5, 1, 0, "lru"), (0.5, 1, 2, "lru"), (0.5, 1, 1, "lfu")]  # prefetch off / deeper, LFU
    rows, reference = [], {}
    for point in grid:
        try:
            if args.graphs:
                row = bench_graph_row(model, store, cfg, *point, args.steps, args.warmup, device, link_bps, reference)
            else:
                row = bench_row(model, store, cfg, *point, args.steps, args.warmup, device, link_bps, reference)
        except Exception as e:  # a failing row is printed and skipped
            traceback.print_exc()
            names = (("budget", "batch", "routing", "decisions") if args.graphs
                     else ("budget", "batch", "prefetch", "policy"))
            row = {**dict(zip(names, point)), "error": f"{type(e).__name__}: {e}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.graphs:
        print_rows(f"{name} (CUDA-graph steps)", rows, GRAPH_COLUMNS)
    else:
        print_rows(name, rows, ROW_COLUMNS)
    result = {"layers_benchmarked": num_layers, "layers": cfg.num_layers, "experts": cfg.num_experts,
              "top_k": cfg.num_experts_per_tok, "hidden": cfg.hidden_size,
              "intermediate": cfg.moe_intermediate_size, "expert_MB": store.expert_bytes / 1e6,
              "store_build_s": build_s,
              "copy_kernel_GBps": {b: v / 1e9 for b, v in copy_kernel_bandwidth(store, device).items()}, "rows": rows}
    print(f"copy kernel from pinned host memory, GB/s by block: {result['copy_kernel_GBps']}", flush=True)
    del store, model
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="JSON results")
    p.add_argument("--smoke", action="store_true", help="tiny shapes (CPU, CI)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--budgets", default="0.25,0.5,1.0")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--layers", type=int, default=None, help="MoE layers per slice (default per model)")
    p.add_argument("--graphs", action="store_true",
                   help="CUDA-graph steps: the device-decided expert cache against all experts resident")
    args = p.parse_args(argv)
    args.budgets = [float(v) for v in args.budgets.split(",")]
    args.batches = [int(v) for v in args.batches.split(",")]
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if device == "cpu" and not args.smoke:
        print("no GPU: running the smoke shapes")
        args.smoke = True
    if args.smoke:
        models = {"smoke": SMOKE_MODEL}
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
    else:
        models = {m: MODELS[m] for m in args.models.split(",")}
    link_bps = h2d_bandwidth(device)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "device": device,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
        "torch": torch.__version__, "triton": triton.__version__, "dtype": "bf16" if device == "cuda" else "fp32",
        "h2d_pinned_GBps": link_bps / 1e9, "h2d_reference_GBps": LINK_GBPS_REFERENCE,
        "steps": args.steps, "warmup": args.warmup, "attention": "not included",
    }
    print(f"pinned host-to-device: {link_bps / 1e9:.1f} GB/s (reference {LINK_GBPS_REFERENCE} GB/s)", flush=True)
    results = {"meta": meta, "models": {}}
    for name, (hf, layers) in models.items():
        results["models"][name] = run_model(name, hf, args.layers or layers, args, device, link_bps)
        if device == "cuda":
            torch.cuda.empty_cache()
            if hasattr(torch._C, "_host_emptyCache"):  # give the pinned store back before the next model
                torch._C._host_emptyCache()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
