"""Locust runs of the same load against different configs, side by side: per concurrency step, latency, goodput
and output, and how many concurrent sessions each config holds at its tenants' SLOs (issue 36: fp16 against
ALR-KVD at the same KV memory budget). Reads the `summary.json` that `python -m loadtest.run` writes in each folder
(`loadtest/gpu_serving.sh` writes one folder per model).

    python -m loadtest.compare OUT/qwen3_30b_long_fp16 OUT/qwen3_30b_long_alrkvd --out OUT/compare

Writes compare.json, compare.md and compare.png (goodput and inter-token p90 against concurrency) in --out.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELD_SHARE = 0.9  # a step is held when this share of its requests meets its tenant's SLO (TTFT and TPOT)


def compare(summaries: dict[str, dict]) -> dict:
    """{config name: summary.json} -> per-step rows and, per config, the most users a held step had and the best
    goodput (requests/s meeting the SLO) of any step, overall and per tenant (a step's many short chats can hold it
    while its few long documents all miss their SLO); with two configs, the second's ratios to the first."""
    rows, configs = [], {}
    for name, summary in summaries.items():
        steps = [c for c in summary["by_concurrency"] if c["users"] is not None]
        for c in steps:
            o = c["overall"]
            rows.append({"config": name, "users": c["users"], "requests": o["requests"], "failed": o["failed"],
                         "ttft_p50_ms": o["ttft_ms"]["p50"], "ttft_p90_ms": o["ttft_ms"]["p90"],
                         "itl_p50_ms": o["itl_ms"]["p50"], "itl_p90_ms": o["itl_ms"]["p90"],
                         "goodput_share": o["goodput"]["share"], "goodput_rps": o["goodput"]["rate_rps"],
                         "output_tok_s": o["output_throughput_tok_s"]})
        configs[name] = _held([(c["users"], c["overall"]) for c in steps])
        tenants = sorted({t for c in steps for t in c.get("tenants", {})})
        if len(tenants) > 1:
            configs[name]["tenants"] = {t: _held([(c["users"], c["tenants"][t]) for c in steps
                                                  if c["tenants"].get(t, {}).get("requests")]) for t in tenants}
    result = {"held_share": HELD_SHARE, "configs": configs, "steps": rows}
    if len(configs) == 2:
        (a, ca), (b, cb) = configs.items()
        result["ratios"] = {"of": b, "to": a, **_ratios(cb, ca)}
        shared = set(ca.get("tenants", {})) & set(cb.get("tenants", {}))
        if shared:
            result["ratios"]["tenants"] = {t: _ratios(cb["tenants"][t], ca["tenants"][t]) for t in sorted(shared)}
    return result


def _held(steps: list[tuple[int, dict]]) -> dict:
    """(users, a step's metrics) -> the most users of a step whose goodput share reaches HELD_SHARE, and the best
    goodput of any step."""
    share = lambda m: m["goodput"]["share"] or 0  # noqa: E731
    return {"sessions_held": max((u for u, m in steps if share(m) >= HELD_SHARE), default=0),
            "best_goodput_rps": max((m["goodput"]["rate_rps"] or 0 for _, m in steps), default=0.0)}


def _ratios(b: dict, a: dict) -> dict:
    ratio = lambda x, y: x / y if y else None  # noqa: E731
    return {"sessions_held": ratio(b["sessions_held"], a["sessions_held"]),
            "best_goodput": ratio(b["best_goodput_rps"], a["best_goodput_rps"])}


def _f(v, nd=1) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def render_markdown(result: dict) -> str:
    lines = [f"A step is held when at least {result['held_share']:.0%} of its requests meet their SLO.", "",
             "| config | sessions held | best goodput (req/s) |", "|---|---:|---:|"]
    lines += [f"| {n} | {c['sessions_held']} | {_f(c['best_goodput_rps'], 3)} |" for n, c in result["configs"].items()]
    if any("tenants" in c for c in result["configs"].values()):
        lines += ["", "Per tenant (its requests alone; held counts the step's users of every tenant):", "",
                  "| config | tenant | held at users | best goodput (req/s) |", "|---|---|---:|---:|"]
        lines += [f"| {n} | {t} | {h['sessions_held']} | {_f(h['best_goodput_rps'], 3)} |"
                  for n, c in result["configs"].items() for t, h in c.get("tenants", {}).items()]
    if "ratios" in result:
        r = result["ratios"]
        lines += ["", f"{r['of']} against {r['to']}: sessions held {_f(r['sessions_held'], 2)}x, "
                      f"best goodput {_f(r['best_goodput'], 2)}x"]
        lines += [f"- {t}: sessions held {_f(x['sessions_held'], 2)}x, best goodput {_f(x['best_goodput'], 2)}x"
                  for t, x in r.get("tenants", {}).items()]
    lines += ["", "| config | users | requests (failed) | TTFT p50 / p90 ms | ITL p50 / p90 ms | goodput share | "
                  "goodput req/s | output tok/s |", "|---|---:|---:|---|---|---:|---:|---:|"]
    for r in result["steps"]:
        lines.append(f"| {r['config']} | {r['users']} | {r['requests']} ({r['failed']}) | "
                     f"{_f(r['ttft_p50_ms'], 0)} / {_f(r['ttft_p90_ms'], 0)} | "
                     f"{_f(r['itl_p50_ms'])} / {_f(r['itl_p90_ms'])} | {_f(r['goodput_share'], 2)} | "
                     f"{_f(r['goodput_rps'], 3)} | {_f(r['output_tok_s'], 0)} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name in result["configs"]:
        steps = [r for r in result["steps"] if r["config"] == name]
        users = [r["users"] for r in steps]
        left.plot(users, [r["goodput_rps"] or 0 for r in steps], "o-", label=name)
        right.plot(users, [r["itl_p90_ms"] for r in steps], "o-", label=name)
    left.set(title="goodput", xlabel="concurrency (users)", ylabel="requests/s meeting the SLO")
    right.set(title="inter-token latency p90", xlabel="concurrency (users)", ylabel="ms")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    left.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="folders of `python -m loadtest.run` (their names name the configs)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    summaries = {}
    for run in map(Path, a.runs):
        path = run / "summary.json"
        if not path.is_file():
            p.error(f"{path} does not exist (was the run finished?)")
        summaries[run.name] = json.loads(path.read_text())
    result = compare(summaries)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "compare.md").write_text(render_markdown(result))
    plot(result, out / "compare.png")
    print(render_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
