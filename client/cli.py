"""alrkvd-client: stream one completion and print it as it arrives, then its latencies.

    alrkvd-client "Write a haiku about caches"                     # gRPC, 127.0.0.1:8001
    alrkvd-client --protocol http --url 127.0.0.1:8000 -n 64 -t 0.7 "Once upon a time"
"""

from __future__ import annotations

import argparse
import json
import sys

from client.api import DEFAULT_MODEL, DEFAULT_URLS, ServerError, complete


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="alrkvd-client", description=__doc__.split("\n\n")[0])
    p.add_argument("prompt")
    p.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    p.add_argument("--url", default=None,
                   help=f"host:port (default {DEFAULT_URLS['grpc']} for gRPC, {DEFAULT_URLS['http']} for HTTP)")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("-n", "--max-tokens", type=int, default=64)
    p.add_argument("-t", "--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--sampling", default=None,
                   help="further sampling parameters as JSON, e.g. '{\"stop\": [\"\\n\"]}'")
    p.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="the server ends the request after this long (finish_reason timeout)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature}
    for key in ("top_p", "top_k", "seed"):
        if getattr(args, key) is not None:
            sampling[key] = getattr(args, key)
    if args.sampling:
        sampling.update(json.loads(args.sampling))

    def echo(text):
        sys.stdout.write(text)
        sys.stdout.flush()

    try:
        result = complete(args.prompt, url=args.url, model=args.model, protocol=args.protocol,
                          on_text=None if args.json else echo, deadline_s=args.deadline, **sampling)
    except ServerError as e:
        print(f"alrkvd-client: server error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # connection refused, unreachable, ...
        print(f"alrkvd-client: cannot reach the server: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({
            "text": result.text, "finish_reason": result.finish_reason,
            "num_input_tokens": result.num_input_tokens, "num_output_tokens": result.num_output_tokens,
            "ttft_s": result.ttft_s, "mean_itl_s": result.mean_itl_s,
            "time_per_output_token_s": result.time_per_output_token_s, "e2e_s": result.e2e_s,
        }))
        return 0
    itl = result.mean_itl_s
    tpot = result.time_per_output_token_s
    print("\n", file=sys.stderr)
    print(f"time to first token   {result.ttft_s * 1e3:8.1f} ms", file=sys.stderr)
    print(f"inter-token latency   {itl * 1e3:8.1f} ms (mean over {len(result.itl_s)} gaps)" if itl
          else "inter-token latency        - (one chunk)", file=sys.stderr)
    if tpot:
        print(f"time per output token {tpot * 1e3:8.1f} ms", file=sys.stderr)
    print(f"tokens                {result.num_input_tokens} in, {result.num_output_tokens} out "
          f"({result.finish_reason})", file=sys.stderr)
    print(f"end to end            {result.e2e_s:8.2f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
