"""Passkey retrieval for several KV formats and contexts, loading the model once (alrkvd-eval passkey's code).

  python benchmarks/quality_passkey.py --contexts 2048 4096 8192 --trials 5 --out reports/passkey.jsonl \
      "fp16" "kivi2" "alrkvd k_bits=2 v_bits=2 ..."

One JSON line per (format, context) is appended to --out: the trials (depth, key, answer, found).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from backend.evaluate import load_engine, run_passkey, set_cache  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("configs", nargs="+")
    p.add_argument("--contexts", type=int, nargs="+", default=[2048, 4096, 8192],
                   help="(put the configurations before this option)")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chunk", type=int, default=512, help="prefill tokens per step (the engine's default 512)")
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.threads:
        import torch
        torch.set_num_threads(a.threads)
    eng = load_engine(a)
    for ctx in a.contexts:
        for line in a.configs:
            parts = line.split()
            kv, opts = parts[0], dict(x.split("=", 1) for x in parts[1:])
            set_cache(eng, kv, opts, ctx)
            trials = run_passkey(eng, ctx, a.trials, a.seed)
            res = {"config": line, "context": ctx, "found": sum(t["found"] for t in trials), "total": len(trials),
                   "model": a.model, "dtype": str(eng.cache.dtype).replace("torch.", ""), "trials": trials}
            with open(a.out, "a") as f:
                f.write(json.dumps(res) + "\n")
            print(f"{ctx:6d} {line:60s} {res['found']}/{res['total']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
