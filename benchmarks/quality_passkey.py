"""Passkey retrieval for several KV formats and contexts, loading the model once (alrkvd-eval passkey's code).

  python benchmarks/quality_passkey.py --contexts 2048 4096 8192 --trials 5 --out reports/passkey.jsonl \
      "fp16" "kivi2" "alrkvd k_bits=2 v_bits=2 ..."

One JSON line per (format, context) is appended to --out: the trials (depth, key, answer, found).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from backend.evaluate import key_found, load_engine, passkey_prompt, set_cache  # noqa: E402


def run_passkey(eng, context: int, trials: int, seed: int = 0) -> list[dict]:
    from backend.sampling import SamplingParams
    rng = random.Random(seed)
    out = []
    for i in range(trials):
        depth = (i + 0.5) / trials
        key = str(rng.randint(10000, 99999))
        ids = passkey_prompt(eng.tokenizer, context, depth, key)
        getattr(eng.cache.format, "clear_decode_memo", lambda: None)()
        t = time.time()
        rid = eng.add_request(None, SamplingParams(max_tokens=8, temperature=0.0), prompt_ids=ids)
        final = None
        while eng.has_unfinished():
            for o in eng.step():
                if o.finished and o.request_id == rid:
                    final = o
        answer = final.text if final is not None else ""
        out.append({"depth": round(depth, 3), "key": key, "prompt_tokens": len(ids), "answer": answer,
                    "found": key_found(key, answer), "seconds": round(time.time() - t, 1)})
    return out


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
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
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
