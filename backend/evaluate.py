"""alrkvd-eval: quality of the KV-cache formats measured through the engine's real paged cache.

  alrkvd-eval perplexity --kv FORMAT [--kv-opt KEY=VALUE ...] --text PATH --context 2048 --max-tokens N
                         [--chunk 128] [--model default|PATH] [--json]
  alrkvd-eval passkey --kv FORMAT [--kv-opt KEY=VALUE ...] --context N [--trials 5] [--json]

Perplexity: the text is tokenized once (no special tokens) and cut into consecutive, non-overlapping
windows of ``--context`` tokens; the first ``--max-tokens`` tokens are used (the last window may be
shorter).  Each window is a fresh sequence fed through ``LLMEngine.score``: chunks of ``--chunk`` tokens,
each chunk attending in full precision to itself and to the cache of all earlier chunks exactly as serving
does (closed blocks compressed by the format, the newest partial block in the full-precision window).
Every position but the first of a window is scored (teacher forced).

Bytes per token are read off the cache's allocation when a window is complete: the blocks the sequence
holds (``block_bytes`` each: every tensor the format allocates per block, metadata included) plus its
full-precision window slot, divided by the tokens it holds.  ``baseline_bytes_per_token`` is a 16-bit
cache of the same model (the serving baseline); ``compression`` is their ratio.

Passkey: a 5-digit pass key hidden at several depths of a long filler text (the usual "The grass is
green..." prompt of Mohtashami & Jaggi 2023), retrieved by greedy generation; each trial reports whether
the key appears in the answer.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import sys
import time

import torch

from backend.kv_formats.base import KVFormat
from backend.kv_presets import PRESETS, resolve_kv

DEFAULT_TEXT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "data", "wikitext-2-raw", "wiki.test.raw")


def parse_kv_opts(items: list[str] | None) -> dict:
    opts = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"--kv-opt expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        opts[k.strip()] = v.strip()
    return opts


def memoize_decode(fmt) -> None:
    """Evaluation speed-up with identical numbers: remember each closed block's reconstruction per layer
    (decode is deterministic and a windowed format's block never changes after ``encode``), so that the
    chunked evaluation does not decode the same block once per later chunk.  Serving does not do this
    (it would keep the decompressed cache); only windowed formats are memoized."""
    if not fmt.windowed:
        return
    memo: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    orig_decode, orig_encode, orig_encode_blocks = fmt.decode, fmt.encode, fmt.encode_blocks
    positional = getattr(fmt, "options", {}).get("key_frame") in ("post_rope", "rotated")

    def encode(layer, block_id, k, v, **kw):
        memo.pop((layer, int(block_id)), None)
        orig_encode(layer, block_id, k, v, **kw)

    def encode_blocks(blocks):
        for layer, block_id, *_ in blocks:
            memo.pop((layer, int(block_id)), None)
        orig_encode_blocks(blocks)

    def decode(layer, block_ids, start_pos=0):
        ids = [int(b) for b in (block_ids.tolist() if torch.is_tensor(block_ids) else block_ids)]
        missing = [b for b in ids if (layer, b) not in memo]
        T = fmt.block_size
        if missing and positional:       # the reconstruction depends on the block's place in the sequence
            starts = start_pos.tolist() if torch.is_tensor(start_pos) else [start_pos + i * T for i in range(len(ids))]
            for b, start in zip(ids, starts):
                if (layer, b) not in memo:
                    memo[(layer, b)] = orig_decode(layer, [b], start_pos=start)
        elif missing:
            k, v = orig_decode(layer, missing)
            for i, b in enumerate(missing):
                memo[(layer, b)] = (k[i * T:(i + 1) * T], v[i * T:(i + 1) * T])
        if not ids:
            return orig_decode(layer, [])
        ks = [memo[(layer, b)][0] for b in ids]
        vs = [memo[(layer, b)][1] for b in ids]
        return torch.cat(ks), torch.cat(vs)

    def clear():
        memo.clear()

    fmt.encode, fmt.encode_blocks, fmt.decode, fmt.clear_decode_memo = encode, encode_blocks, decode, clear
    # several layers' blocks (the cache decodes a step's history so) through the memo too, a layer at a time
    fmt.decode_layers = functools.partial(KVFormat.decode_layers, fmt)


def load_engine(args, num_seqs: int = 1):
    """The engine (model, tokenizer) with a placeholder cache; ``set_cache`` installs the format to measure."""
    from backend.engine import EngineArgs, LLMEngine
    eargs = EngineArgs(model=args.model, device=args.device, dtype=args.dtype, kv_format="fp16",
                       kv_options={}, kv_budget_bytes=16 << 20, max_num_seqs=num_seqs,
                       max_num_batched_tokens=max(args.chunk, num_seqs))
    return LLMEngine(eargs)


def set_cache(eng, kv_format: str, options: dict, context: int, num_seqs: int = 1):
    """Replace the engine's paged cache by one of ``kv_format`` (or a preset) whose budget holds ``num_seqs``
    sequences of ``context`` tokens (the real PagedKVCache: allocation, window slots, encode on block close)."""
    kv_format, options = resolve_kv(kv_format, options)
    dtype = eng.model.embed_tokens.weight.dtype
    from backend.kv_cache import dense_kv_bytes, meta_format
    probe = meta_format(eng.cfg, kv_format, options, dtype)
    per_block, bs = probe.bytes_per_block(), probe.block_size
    slot = dense_kv_bytes(eng.cfg, bs + int(options.get("sink_tokens", 0)), dtype.itemsize)
    blocks = num_seqs * (-(-(context + 64) // bs) + 1) + 1  # + the cache's scratch block (and window slot)
    budget = blocks * per_block + (num_seqs + 1) * slot + 1
    if eng.max_model_len < context:
        raise SystemExit(f"context {context} exceeds the model's {eng.max_model_len} positions")
    eng.reset_cache(kv_format, options, budget, num_seqs)
    memoize_decode(eng.cache.format)
    return eng


def build_engine(args, context: int, num_seqs: int = 1):
    eng = load_engine(args, num_seqs)
    return set_cache(eng, *resolve_kv(args.kv, parse_kv_opts(args.kv_opt)), context, num_seqs)


def _options(cache) -> dict:
    """The format's options and the cache's own (block size, sink)."""
    return {**cache.format.options, "block_size": cache.block_size,
            **({"sink_tokens": cache.sink_tokens} if cache.sink_tokens else {})}


def _describe(eng, args) -> dict:
    return {"kv": eng.cache.kv_format, "preset": args.kv if args.kv in PRESETS else None,
            "kv_options": _options(eng.cache),
            "model": args.model, "dtype": str(eng.cache.dtype).replace("torch.", "")}


def load_text_ids(eng, path: str, max_tokens: int | None) -> list[int]:
    if not os.path.exists(path):
        raise SystemExit(f"text file not found: {path} (the WikiText-2 copy lives in data/wikitext-2-raw/)")
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    ids = eng.tokenizer.encode(text, add_special_tokens=False)
    return ids[:max_tokens] if max_tokens else ids


def window_bytes_per_token(cache, kv) -> float:
    """Bytes allocated to one sequence (its blocks + its full-precision window slot) per token it holds."""
    used = len(kv.block_table) * cache.block_bytes + (cache.slot_bytes if kv.window_slot is not None else 0)
    return used / kv.num_tokens


def perplexity(eng, ids: list[int], context: int, chunk: int, verbose: bool = False) -> dict:
    """Teacher-forced perplexity of ``ids`` in non-overlapping windows of ``context`` through ``eng.cache``."""
    cache = eng.cache
    nll_sum, count = 0.0, 0
    per_window, bpt = [], []
    for w, start in enumerate(range(0, len(ids), context)):
        window = ids[start:start + context]
        if len(window) < 2:
            break
        getattr(cache.format, "clear_decode_memo", lambda: None)()
        tw = time.time()
        seen = []
        logits = eng.score(window, chunk_size=chunk, on_chunk=lambda kv: seen.append(window_bytes_per_token(cache, kv)))
        bpt.append(seen[-1])
        nll = torch.nn.functional.cross_entropy(logits[:-1].float(), torch.tensor(window[1:]), reduction="sum").item()
        nll_sum += nll
        count += len(window) - 1
        per_window.append({"tokens": len(window) - 1, "ppl": round(math.exp(nll / (len(window) - 1)), 4),
                           "seconds": round(time.time() - tw, 1)})
        if verbose:
            print(f"window {w}: ppl {per_window[-1]['ppl']:.3f} running {math.exp(nll_sum / count):.3f} "
                  f"({per_window[-1]['seconds']} s)", file=sys.stderr, flush=True)
    baseline = cache.baseline_bytes_per_token()
    full = bpt[0] if bpt else float("nan")    # the first window is always a full one when there are several
    window_tokens = cache.block_size + cache.sink_tokens if cache.windowed else 0
    blocks_bpt = cache.block_bytes / cache.block_size
    # the same sequence with its full-precision window held in 16 bits (what a bf16/fp16 model allocates)
    closed = (context // cache.block_size) if cache.windowed else -(-context // cache.block_size)
    from backend.kv_cache import dense_kv_bytes
    win16 = dense_kv_bytes(eng.cfg, window_tokens, 2) + cache.attn_slot_bytes
    bpt16 = (closed * cache.block_bytes + win16) / context
    return {
        "ppl": math.exp(nll_sum / count),
        "nll": nll_sum / count,
        "tokens": count,
        "windows": len(per_window),
        "context": context,
        "chunk": chunk,
        "kv": cache.kv_format,
        "kv_options": _options(cache),
        "dtype": str(cache.dtype).replace("torch.", ""),
        "kv_bytes_per_token": full,
        "baseline_bytes_per_token": baseline,
        "compression": baseline / full,
        "kv_block_bytes_per_token": blocks_bpt,
        "compression_blocks": baseline / blocks_bpt,
        "kv_bytes_per_token_16bit_window": bpt16,
        "compression_16bit_window": baseline / bpt16,
        "per_window": per_window,
    }


def cmd_perplexity(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    eng = build_engine(args, args.context)
    ids = load_text_ids(eng, args.text, args.max_tokens)
    res = perplexity(eng, ids, args.context, args.chunk, args.verbose)
    res.update(preset=args.kv if args.kv in PRESETS else None, model=args.model, text=os.path.basename(args.text),
               seconds=round(time.time() - t0, 1))
    return res


FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
        "I will quiz you about the important information there. ")


def passkey_prompt(tokenizer, context: int, depth: float, key: str) -> list[int]:
    """Token ids of a passkey prompt of about ``context`` tokens with the key at relative ``depth``."""
    needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
    question = "What is the pass key? The pass key is"
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    n_fixed = len(enc(TASK + needle + question))
    n_fill = len(enc(FILLER))
    reps = max(1, (context - n_fixed - 16) // n_fill)
    before = int(round(reps * depth))
    text = TASK + FILLER * before + needle + FILLER * (reps - before) + question
    return enc(text)


def key_found(key: str, answer: str) -> bool:
    """The key appears in the answer as a whole number (``604949`` does not contain the key ``60494``)."""
    import re
    return re.search(rf"(?<!\d){re.escape(key)}(?!\d)", answer) is not None


def run_passkey(eng, context: int, trials: int, seed: int = 0, verbose: bool = False) -> list[dict]:
    """Greedy retrieval of a 5-digit key hidden at depths (i + 0.5) / trials of a `context`-token prompt."""
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
        found = key_found(key, answer)
        out.append({"depth": round(depth, 3), "key": key, "prompt_tokens": len(ids), "answer": answer,
                    "found": found, "seconds": round(time.time() - t, 1)})
        if verbose:
            print(f"depth {depth:.2f} key {key}: {'found' if found else 'MISSED'} ({answer!r})", file=sys.stderr,
                  flush=True)
    return out


def cmd_passkey(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    eng = build_engine(args, args.context)
    trials = run_passkey(eng, args.context, args.trials, args.seed, args.verbose)
    return {"context": args.context, **_describe(eng, args), "trials": trials,
            "found": sum(t["found"] for t in trials), "total": len(trials),
            "seconds": round(time.time() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="alrkvd-eval", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp):
        sp.add_argument("--kv", default="fp16", help="KV format (full, fp16, int8, kivi2/3/4, alrkvd) or preset "
                        f"({', '.join(PRESETS)})")
        sp.add_argument("--kv-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="format option (repeatable), e.g. block_size=128, k_bits=2")
        sp.add_argument("--model", default="default", help="'default' (SmolLM2-135M GGUF), a .gguf or a HF folder")
        sp.add_argument("--device", default="cpu")
        sp.add_argument("--dtype", default="auto")
        sp.add_argument("--chunk", type=int, default=128, help="prefill chunk (tokens fed per step)")
        sp.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
        sp.add_argument("--json", action="store_true", help="print one JSON object")
        sp.add_argument("--verbose", "-v", action="store_true")

    pp = sub.add_parser("perplexity", help="teacher-forced perplexity through the paged cache")
    common(pp)
    pp.add_argument("--text", default=DEFAULT_TEXT)
    pp.add_argument("--context", type=int, default=2048)
    pp.add_argument("--max-tokens", type=int, default=16384)

    pk = sub.add_parser("passkey", help="pass-key retrieval by greedy generation")
    common(pk)
    pk.add_argument("--context", type=int, default=2048)
    pk.add_argument("--trials", type=int, default=5)
    pk.add_argument("--seed", type=int, default=0)

    args = p.parse_args(argv)
    if args.cmd == "perplexity":
        res = cmd_perplexity(args)
        if args.json:
            print(json.dumps(res))
        else:
            print(f"{res['preset'] + ': ' if res['preset'] else ''}{res['kv']} {res['kv_options']}: ppl {res['ppl']:.4f} over {res['tokens']} tokens, "
                  f"{res['kv_bytes_per_token']:.1f} B/token (baseline {res['baseline_bytes_per_token']}), "
                  f"compression {res['compression']:.2f}x")
    else:
        res = cmd_passkey(args)
        if args.json:
            print(json.dumps(res))
        else:
            for t in res["trials"]:
                print(f"depth {t['depth']:.2f} key {t['key']}: {'found' if t['found'] else 'not found'} "
                      f"(answer {t['answer']!r})")
            print(f"{res['found']}/{res['total']} found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
