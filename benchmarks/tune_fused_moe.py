"""Tune the fused MoE kernel's tiles for a model shape on this GPU and keep them as data:
`kernels/configs/fused_moe,device_name=<GPU>.json` (or `--out-dir`), the file `kernels/tuning.py` reads.

For each projection of the shape (gate/up with the GLU, then down) and each token count given, every
config of a small space is timed on routed tokens of that count (uniform routing, seeded), as a CUDA
graph replay so that only the GPU's time counts. Token counts that share the launcher's key (the
M tile, `fused_moe.block_size_m`) share a config: the one with the lowest sum of its time over the
best time at each count. The report gives the launcher's default and the chosen config per key and count.

    python benchmarks/tune_fused_moe.py --model qwen3-30b-a3b --tokens 1,8,32,256 --out-dir kernels/configs
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import fused_moe as fm  # noqa: E402
from kernels.tuning import device_name, save_configs  # noqa: E402
from server.dummy_repository import SHAPES  # noqa: E402

SPACE = {"BLOCK_SIZE_N": [32, 64, 128], "BLOCK_SIZE_K": [64, 128, 256], "GROUP_SIZE_M": [1],
         "num_warps": [4, 8], "num_stages": [3, 4]}


def configs(block_m: int, device) -> list[dict]:
    default = fm._default_config(block_m, device)
    space = [dict(zip(SPACE, values)) for values in itertools.product(*SPACE.values())]
    return [default] + [c for c in space if c != default]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    p.add_argument("--tokens", default="1,8,32,256")
    p.add_argument("--out-dir", type=Path, default=Path("kernels/configs"))
    p.add_argument("--report", type=Path, help="the timings as JSON")
    p.add_argument("--block-m", type=int, help="this M tile instead of the launcher's `block_size_m` (to try others)")
    a = p.parse_args()
    dev = torch.device("cuda")
    s = SHAPES[a.model]
    E, k, H = s.get("num_experts") or s["num_local_experts"], s["num_experts_per_tok"], s["hidden_size"]
    inter = s.get("moe_intermediate_size") or s["intermediate_size"]
    g = torch.Generator(device=dev).manual_seed(0)
    w13 = torch.randn(E, 2 * inter, H, device=dev, dtype=torch.bfloat16, generator=g) * 0.02
    w2 = torch.randn(E, H, inter, device=dev, dtype=torch.bfloat16, generator=g) * 0.02
    slot_map = torch.arange(E, dtype=torch.int32, device=dev)
    timings: dict[str, dict[str, dict[int, float]]] = {}  # key -> config -> tokens -> ms
    launcher_get_config = fm.get_config
    for T in [int(t) for t in a.tokens.split(",")]:
        x = torch.randn(T, H, device=dev, dtype=torch.bfloat16, generator=g)
        ids = torch.stack([torch.randperm(E, device=dev, generator=g)[:k] for _ in range(T)]).to(torch.int32)
        weights = torch.rand(T, k, device=dev, generator=g).softmax(-1).to(torch.bfloat16)
        align = fm.moe_align_block_size(ids, a.block_m or fm.block_size_m(T * k, E), E)
        act = torch.empty(T * k, inter, device=dev, dtype=torch.bfloat16)
        pairs = torch.empty(T * k, H, device=dev, dtype=torch.bfloat16)
        for glu in (True, False):
            n, kk = (inter, H) if glu else (H, inter)
            key = f"N={n},K={kk},glu={int(glu)},M={align.block_size}"
            for cfg in configs(align.block_size, dev):
                fm.get_config = lambda *_, cfg=cfg: dict(cfg)  # the candidate, in place of the tuned file
                if glu:
                    def run():
                        fm._launch(x, w13, act, weights, align, slot_map, T * k, k, glu=True, mul_routed_weight=False)
                else:
                    def run():
                        fm._launch(act, w2, pairs, weights, align, slot_map, T * k, 1, glu=False,
                                   mul_routed_weight=True)
                try:
                    run()  # compile outside the graph
                    torch.cuda.synchronize()
                    ms = triton.testing.do_bench_cudagraph(run, rep=20)
                except (triton.runtime.errors.OutOfResources, RuntimeError) as e:
                    print(f"skip {key} {cfg}: {type(e).__name__}", file=sys.stderr)
                    continue
                timings.setdefault(key, {}).setdefault(json.dumps(cfg, sort_keys=True), {})[T] = ms
    fm.get_config = launcher_get_config
    chosen, report = {}, {}
    for key, by_cfg in timings.items():
        counts = set.union(*(set(v) for v in by_cfg.values()))
        complete = {c: v for c, v in by_cfg.items() if set(v) == counts}
        best = {t: min(v[t] for v in complete.values()) for t in counts}
        score = {c: sum(v[t] / best[t] for t in counts) for c, v in complete.items()}
        pick = min(score, key=score.get)
        default = json.dumps(fm._default_config(int(key.rsplit("M=", 1)[1]), dev), sort_keys=True)
        chosen[key] = json.loads(pick)
        report[key] = {"chosen": chosen[key], "default_us": {t: 1e3 * complete[default][t] for t in sorted(counts)},
                       "chosen_us": {t: 1e3 * complete[pick][t] for t in sorted(counts)}}
        print(key, "default", {t: round(1e3 * complete[default][t], 1) for t in sorted(counts)},
              "chosen", {t: round(1e3 * complete[pick][t], 1) for t in sorted(counts)}, chosen[key])
    path = save_configs(a.out_dir, "fused_moe", device_name(dev), chosen)
    print(f"wrote {path}")
    if a.report:
        a.report.write_text(json.dumps({"model": a.model, "device": torch.cuda.get_device_name(), "keys": report},
                                       indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
