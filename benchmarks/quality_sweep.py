"""Pareto sweep of KV formats on WikiText-2 through the engine's real paged cache (alrkvd-eval's code path),
loading the model once for all configurations.

  python benchmarks/quality_sweep.py --max-tokens 16384 --out reports/quality.jsonl \
      "fp16" "kivi4" "kivi2" "alrkvd k_bits=2 v_bits=2 rank_per_head=4" ...

Each configuration is ``FORMAT [KEY=VALUE ...]``; one JSON line per configuration is appended to --out
(the same object as ``alrkvd-eval perplexity --json``).  Configurations already in --out (same format,
options, context, chunk and token count) are skipped, so an interrupted sweep resumes.  --configs-file is
re-read before each configuration: lines appended to it while the sweep runs are measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from backend.evaluate import DEFAULT_TEXT, load_engine, load_text_ids, perplexity, set_cache  # noqa: E402


def parse_config(line: str) -> tuple[str, dict]:
    parts = line.split()
    return parts[0], dict(p.split("=", 1) for p in parts[1:])


def key_of(kv: str, opts: dict, context: int, chunk: int, tokens: int, first_token: int = 0) -> str:
    key = [kv, sorted(opts.items()), context, chunk, tokens] + ([first_token] if first_token else [])
    return json.dumps(key)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("configs", nargs="*")
    p.add_argument("--configs-file")
    p.add_argument("--text", default=DEFAULT_TEXT)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=16384)
    p.add_argument("--first-token", type=int, default=0,
                   help="score from this token of the text on (a multiple of --context keeps the windows of a whole run)")
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    def configs():
        """The command line's configurations, then the file's, re-read before each configuration so that
        lines appended while the sweep runs join the same run (same process, model and code)."""
        out = list(a.configs)
        if a.configs_file:
            with open(a.configs_file) as f:
                out += [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
        return out

    done = set()
    if os.path.exists(a.out):
        with open(a.out) as f:
            for ln in f:
                r = json.loads(ln)
                done.add(r.get("key"))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    eng = load_engine(a)
    ids = load_text_ids(eng, a.text, a.first_token + a.max_tokens)[a.first_token:]
    while True:
        todo = [ln for ln in configs()
                if key_of(*parse_config(ln), a.context, a.chunk, len(ids), a.first_token) not in done]
        if not todo:
            break
        line = todo[0]
        kv, opts = parse_config(line)
        key = key_of(kv, opts, a.context, a.chunk, len(ids), a.first_token)
        done.add(key)
        t0 = time.time()
        set_cache(eng, kv, opts, a.context)
        res = perplexity(eng, ids, a.context, a.chunk)
        res.update(key=key, config=line, model=a.model, text=os.path.basename(a.text), first_token=a.first_token,
                   seconds=round(time.time() - t0, 1))
        with open(a.out, "a") as f:
            f.write(json.dumps(res) + "\n")
        print(f"{line:60s} ppl {res['ppl']:.4f}  B/tok {res['kv_bytes_per_token']:.0f} "
              f"comp {res['compression']:.2f}x (16-bit window {res['compression_16bit_window']:.2f}x, "
              f"blocks {res['compression_blocks']:.2f}x)  {res['seconds']}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
