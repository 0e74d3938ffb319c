"""Prefix caching at a KV memory budget: chat sessions whose every turn repeats the session's history, more of them
than a 16-bit cache holds, against a compressed cache at the same budget (issue 36: what the compressed cache buys).

`--sessions` sessions of `--turns` turns, each turn adding `--message` tokens of WikiText-2 (a window of the test
text per session); turn t's prompt is the session's first (t + 1) x message tokens, and its answer `--answer` tokens
(greedy). The turns come round-robin (every session's first turn, then every second one, ...), one request at a time,
so between two turns of a session every other session passes through the cache: a cache that cannot hold all the
histories loses each before its next turn (released blocks are evicted least recently released first). Per arm (a KV
format, prefix caching on or off): the cache's capacity in tokens, prompt tokens, those taken from the cache, and the
wall time; with it on, the share of answers (greedy) the same as with it off (all, for a lossless format). CPU,
SmolLM2-135M (real weights); wall times compare arms of one format only (on the CPU the compressed formats attend
through the PyTorch path).

    python benchmarks/bench_prefix_cache.py --kv-formats fp16,alrkvd-cpu --budget-mb 64,512 --out prefix.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from backend.engine import EngineArgs, LLMEngine  # noqa: E402
from backend.evaluate import DEFAULT_TEXT  # noqa: E402
from backend.sampling import SamplingParams  # noqa: E402


def sessions(tokenizer, count: int, length: int) -> list[list[int]]:
    """`count` windows of `length` tokens of the text, one a session, spread over it."""
    ids = tokenizer.encode(Path(DEFAULT_TEXT).read_text())
    stride = (len(ids) - length) // max(count - 1, 1)
    assert stride >= length, "the text is too short for so many sessions"
    return [ids[i * stride:i * stride + length] for i in range(count)]


def run_arm(kv_format: str, budget_mb: int, prefix_caching: bool, a) -> dict:
    engine = LLMEngine(EngineArgs(kv_format=kv_format, kv_budget_bytes=budget_mb << 20, max_num_seqs=4,
                                  enable_prefix_caching=prefix_caching))
    texts = sessions(engine.tokenizer, a.sessions, a.turns * a.message)
    params = SamplingParams(max_tokens=a.answer, temperature=0, ignore_eos=True)
    prompt_tokens, answers, start = 0, [], time.perf_counter()
    for turn in range(a.turns):
        for ids in texts:
            prompt = ids[:(turn + 1) * a.message]
            engine.add_request(None, params, prompt_ids=prompt)
            while engine.has_unfinished():
                answers += [o.token_ids for o in engine.step() if o.finished]
            prompt_tokens += len(prompt)
    wall = time.perf_counter() - start
    cache = engine.cache
    return {"kv_format": kv_format, "budget_mb": budget_mb, "prefix_caching": prefix_caching,
            "capacity_tokens": cache.allocator.num_blocks * cache.block_size,
            "history_tokens": a.sessions * a.message * a.turns * (a.turns - 1) // 2,  # the most a cache could give
            "prompt_tokens": prompt_tokens, "cached_tokens": engine.prefix_cache_hit_tokens,
            "cached_share": engine.prefix_cache_hit_tokens / prompt_tokens, "wall_s": wall, "answers": answers}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kv-formats", default="fp16,alrkvd-cpu")
    p.add_argument("--budget-mb", default="64,512", help="KV budgets in MiB (comma list)")
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--message", type=int, default=256, help="tokens a turn adds to its session's prompt")
    p.add_argument("--answer", type=int, default=4, help="tokens generated a turn")
    p.add_argument("--out")
    a = p.parse_args()
    rows = []
    for budget in map(int, a.budget_mb.split(",")):
        for kv_format in a.kv_formats.split(","):
            arms = [run_arm(kv_format, budget, on, a) for on in (False, True)]
            same = [x == y for x, y in zip(arms[0]["answers"], arms[1]["answers"])]
            arms[1]["same_answers"] = sum(same) / len(same)
            # a lossless cache gives the same tokens; a compressed one reads the cached history compressed where,
            # without the cache, a turn's prompt chunk reads it exactly
            assert kv_format not in ("fp16", "full") or all(same), "prefix caching changed a greedy answer"
            rows += arms
            for r in arms:
                print(f"{budget:5d} MiB  {kv_format:11s} prefix caching {'on ' if r['prefix_caching'] else 'off'}: "
                      f"holds {r['capacity_tokens']:6d} tokens; {r['cached_tokens']:6d} of {r['prompt_tokens']} "
                      f"prompt tokens from the cache ({r['cached_share']:.0%}; the histories are "
                      f"{r['history_tokens'] / r['prompt_tokens']:.0%}), {r['wall_s']:.1f} s"
                      + (f", {r['same_answers']:.0%} of the answers as without it" if "same_answers" in r else ""),
                      flush=True)
    if a.out:
        meta = {k: getattr(a, k) for k in ("sessions", "turns", "message", "answer")}
        Path(a.out).write_text(json.dumps({"meta": meta, "rows": [{k: v for k, v in r.items() if k != "answers"}
                                                                  for r in rows]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
