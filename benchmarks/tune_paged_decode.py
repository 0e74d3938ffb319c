"""Tune the paged decode kernel's launch (`fp16` KV) for a model shape on this GPU and keep it as data:
`kernels/configs/paged_decode_stage1,device_name=<GPU>.json` (or `--out-dir`), the file `kernels/tuning.py` reads.

The kernel has one config per (head_dim, group, page_size), so the sweep times every config of a small space at each
(batch, context) given and keeps the one with the lowest product of its time over the fastest at each shape (as
`bench_attention.py --tune` ranks). Calls are timed as a decode step's graph runs them: block tables as wide as the
engine's `max_model_len` (the launch's split count follows the table, the busy splits the context), over copies of
the cache twice the L2's bytes together (as a step's layers are), from CUDA-graph replays
(`bench_attention.time_calls`).

    python benchmarks/tune_paged_decode.py --model qwen3-30b-a3b --shapes 1x4096 8x32768 32x4096 --out-dir kernels/configs
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_attention import num_copies, time_calls  # noqa: E402
from kernels import paged_attention as pa  # noqa: E402
from kernels.tuning import device_name, save_configs  # noqa: E402
from server.dummy_repository import SHAPES  # noqa: E402

SPACE = {"BLOCK_N": [32, 64, 128], "num_warps": [4, 8], "num_stages": [2, 3], "MIN_TOKENS_PER_SPLIT": [128, 256, 512]}
PAGE = 16


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    p.add_argument("--shapes", nargs="+", default=["1x4096", "8x32768", "32x4096"], help="BATCHxCONTEXT")
    p.add_argument("--table-tokens", type=int, default=40960, help="the block table's width in tokens (max_model_len)")
    p.add_argument("--out-dir", type=Path, help="write the chosen config here (default: report only)")
    p.add_argument("--report", type=Path, help="the timings as JSON")
    a = p.parse_args()
    shape = SHAPES[a.model]
    hq, hkv = shape["num_attention_heads"], shape["num_key_value_heads"]
    d = shape.get("head_dim") or shape["hidden_size"] // hq
    dev = torch.device("cuda")
    width = a.table_tokens // PAGE
    configs = [dict(zip(SPACE, v)) for v in itertools.product(*SPACE.values())]
    default = pa.stage1_config(d, hq // hkv, PAGE, dev)
    configs = [default] + [c for c in configs if c != default]
    rows = []
    for text in a.shapes:
        batch, context = (int(x) for x in text.split("x"))
        blocks = batch * -(-context // PAGE)
        copies = num_copies(2 * blocks * PAGE * hkv * d * 2, "cuda")
        caches = [[torch.randn(blocks, PAGE, hkv, d, device=dev, dtype=torch.bfloat16) for _ in range(2)]
                  for _ in range(copies)]
        tables = torch.zeros(batch, width, dtype=torch.int32, device=dev)
        tables[:, : blocks // batch] = torch.randperm(blocks, device=dev).view(batch, -1).int()
        seq_lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
        q = torch.randn(batch, hq, d, device=dev, dtype=torch.bfloat16)
        tickets = torch.zeros(batch * hkv, dtype=torch.int32, device=dev)
        ref = pa.paged_decode_attention(q, *caches[0], tables, seq_lens, d ** -0.5)
        for cfg in configs:
            def call(cache, cfg=cfg):
                return pa.paged_decode_attention(q, *cache, tables, seq_lens, d ** -0.5, tickets=tickets, config=cfg)
            try:
                err = (call(caches[0]).float() - ref.float()).abs().max().item()
                us = time_calls([lambda c=c: call(c) for c in caches], "cuda") * 1e6
                rows.append({"batch": batch, "context": context, "config": cfg, "us": us, "max_err": err})
                print(f"B={batch:2} L={context:6} {cfg} {us:7.2f} us  err {err:.1e}", flush=True)
            except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory: the config is out
                rows.append({"batch": batch, "context": context, "config": cfg, "error": str(exc)[:200]})
        del caches
        torch.cuda.empty_cache()
    fastest = {}
    for r in rows:
        if "us" in r:
            fastest[r["batch"], r["context"]] = min(r["us"], fastest.get((r["batch"], r["context"]), float("inf")))
    score = {}
    for r in rows:
        key = json.dumps(r["config"], sort_keys=True)
        score[key] = score.get(key, 1.0) * (r["us"] / fastest[r["batch"], r["context"]] if "us" in r else float("inf"))
    best = json.loads(min(score, key=score.get))
    for text in a.shapes:
        batch, context = (int(x) for x in text.split("x"))
        at = {json.dumps(r["config"], sort_keys=True): r["us"] for r in rows
              if (r["batch"], r["context"]) == (batch, context) and "us" in r}
        print(f"B={batch:2} L={context:6}: default {at.get(json.dumps(default, sort_keys=True), float('nan')):7.2f} us, "
              f"chosen {at[json.dumps(best, sort_keys=True)]:7.2f} us")
    print("chosen:", best)
    key = f"head_dim={d},group={hq // hkv},page_size={PAGE}"
    if a.out_dir:
        path = save_configs(a.out_dir, "paged_decode_stage1", device_name(dev), {key: best})
        print("wrote", path)
    if a.report:
        a.report.write_text(json.dumps({"key": key, "default": default, "chosen": best, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
