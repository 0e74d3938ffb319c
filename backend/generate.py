"""`alrkvd-generate`: offline generation with the engine (no server).

    alrkvd-generate --prompt "The capital of France is" --max-tokens 16 --temperature 0 --json
    alrkvd-generate --chat --prompt "What is the capital of France?" --kv alrkvd
"""
from __future__ import annotations

import argparse
import json
import sys

from backend.engine import EngineArgs, LLMEngine
from backend.kv_presets import PRESETS
from backend.sampling import SamplingParams


def parse_kv_options(pairs: list[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--kv-opt expects KEY=VALUE, got {pair!r}")
        options[key] = value
    return options


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(prog="alrkvd-generate", description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", action="append", required=True, help="raw prompt text (repeatable)")
    ap.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 means greedy")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--kv", default="fp16", help=f"KV format (full, fp16, int8, kivi2/3/4, alrkvd) or preset "
                                                 f"({', '.join(PRESETS)})")
    ap.add_argument("--kv-opt", action="append", default=[], metavar="KEY=VALUE", help="KV format option")
    ap.add_argument("--kv-budget-bytes", type=int, default=256 << 20)
    ap.add_argument("--model", default="default", help="'default' (SmolLM2), 'smollm2-moe' (it split into experts), a .gguf file "
                    "or a Hugging Face folder")
    ap.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    ap.add_argument("--tokenizer", help="tokenizer source (defaults to the model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--weight-dtype", default="auto", choices=["auto", "float16"],
                    help="float16 (CPU): linear weights in fp16 through FBGEMM, about 2x faster decode")
    ap.add_argument("--json", action="store_true", help="one JSON object per prompt, one per line")
    args = ap.parse_args(argv)

    engine = LLMEngine(EngineArgs(model=args.model, load_format=args.load_format, tokenizer=args.tokenizer,
                                  device=args.device, dtype=args.dtype, weight_dtype=args.weight_dtype,
                                  kv_format=args.kv,
                                  kv_options=parse_kv_options(args.kv_opt), kv_budget_bytes=args.kv_budget_bytes,
                                  max_num_seqs=max(1, len(args.prompt))))
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed, ignore_eos=args.ignore_eos)
        params.validate(engine.limits)
        prompts = [[{"role": "user", "content": p}] if args.chat else p for p in args.prompt]
        outputs = engine.generate(prompts, params)
    except ValueError as e:
        raise SystemExit(f"alrkvd-generate: {e}")
    for prompt, out in zip(args.prompt, outputs):
        if args.json:
            print(json.dumps({"prompt": prompt, "text": out.text, "token_ids": out.token_ids,
                              "finish_reason": out.finish_reason, "num_prompt_tokens": out.num_prompt_tokens,
                              "num_output_tokens": out.num_output_tokens}, ensure_ascii=False))
        else:
            print(out.text)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
