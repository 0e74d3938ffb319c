"""Report of one load test, from its raw files: summary.json, report.md and PNG plots.

    python -m loadtest.report reports/<name>          # reads requests.jsonl + run.json there

Everything is recomputed from requests.jsonl (one line per request; warm-up lines are dropped), so
percentiles are exact, not Locust's rounded buckets. Per load step (`by_concurrency`) a request counts in
the step that sent it, its inter-token gaps in the step in which each came. Plots: ITL percentiles against concurrency
(itl_vs_concurrency.png), the TTFT distribution per tenant (ttft_distribution.png), output tokens/s
over time per tenant (tokens_per_s.png) and per-tenant latency side by side (latency_by_tenant.png). Where the
run read the server's /metrics (server_steps.json), each step of users also gets the engine's steps in its time: the
mean step in the server beside the clients' inter-token gaps shows what the server adds between steps.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from loadtest import metrics
from loadtest.records import REQUESTS_FILE, read_records, read_run_meta

SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
STEPS_FILE = "server_steps.json"  # loadtest.run: the server's engine steps over the run, and its readings through it
PLOTS = {
    "itl_vs_concurrency": "itl_vs_concurrency.png",
    "ttft_distribution": "ttft_distribution.png",
    "tokens_per_s": "tokens_per_s.png",
    "latency_by_tenant": "latency_by_tenant.png",
}


def _slos(meta: dict) -> dict[str, dict]:
    return {t["name"]: t.get("slo") or {} for t in (meta.get("tenants") or {}).get("tenants", [])}


def stage_users(rec: metrics.RequestRecord, meta: dict) -> int | None:
    """Concurrency when `rec` was sent: the users running in its process (single-process runs), else
    the users the shape's plan in run.json asked for at that time (distributed runs: a worker only
    knows its own users)."""
    stages = (meta.get("plan") or {}).get("stages") or []
    started = meta.get("started")
    if (meta.get("workers") or 1) == 1 and rec.users is not None:
        return rec.users
    if stages and started is not None:
        at = rec.t_start - started
        for s in stages:
            if s["start_s"] <= at < s["end_s"]:
                return int(s["users"])
        return int(stages[-1]["users"] if at >= stages[-1]["start_s"] else stages[0]["users"])
    return rec.users


def stage_window(users: int | None, meta: dict) -> tuple[float, float] | None:
    """Wall-clock [start, end) of the one stage of the shape's plan that ran `users` users (None when the run
    had no stages or several ran that many)."""
    stages = [s for s in (meta.get("plan") or {}).get("stages") or [] if s["users"] == users]
    started = meta.get("started")
    if len(stages) != 1 or started is None:
        return None
    return started + stages[0]["start_s"], started + stages[0]["end_s"]


def ttft_by_turn(records: list[metrics.RequestRecord], turns: int) -> dict:
    """Time to first token of a session's first turns and of its later ones (prompt k is turn k % turns), which
    may find their history in the server's prefix cache."""
    ttft = {"first": [], "later": []}
    for r in records:
        m = metrics.derive(r)
        if m.ok and m.ttft is not None and r.prompt_seq is not None:
            ttft["first" if r.prompt_seq % turns == 0 else "later"].append(m.ttft)
    return {k: metrics.distribution(v, 1000.0) for k, v in ttft.items()}


def build_summary(records: list[metrics.RequestRecord], meta: dict) -> dict:
    measured = [r for r in records if not r.warmup]
    slos = _slos(meta)
    declared = [t["name"] for t in (meta.get("tenants") or {}).get("tenants", [])]
    turns = {t["name"]: (t.get("prompt") or {}).get("turns", 1) for t in (meta.get("tenants") or {}).get("tenants", [])}
    seen = {r.tenant for r in records}
    tenants = [n for n in declared if n in seen] + sorted(seen - set(declared))
    window = metrics.measured_window(measured)
    by_tenant = {}
    for name in tenants:
        recs = [r for r in measured if r.tenant == name]
        s = metrics.summarize(recs, slos, window)
        s["slo"] = slos.get(name, {})
        s["model"] = recs[0].model if recs else None
        s["protocol"] = recs[0].protocol if recs else None
        s["tokens_counted_by_server"] = all(r.tokens_from_server for r in recs)
        if turns.get(name, 1) > 1:
            s["ttft_ms_by_turn"] = ttft_by_turn(recs, turns[name])
        by_tenant[name] = s
    levels = defaultdict(list)
    for r in measured:
        levels[stage_users(r, meta)].append(r)
    by_conc = []
    for users in sorted(levels, key=lambda u: (u is None, u or 0)):
        recs = levels[users]
        w = metrics.measured_window(recs)
        step = {
            "users": users,
            "overall": metrics.summarize(recs, slos, w),
            "tenants": {n: metrics.summarize([r for r in recs if r.tenant == n], slos, w)
                        for n in tenants if any(r.tenant == n for r in recs)},
        }
        window = stage_window(users, meta)
        if window is not None:  # the step's gaps by when they came, not by when their request was sent
            step["overall"]["itl_ms"] = metrics.distribution(metrics.itl_in_window(measured, *window), 1000.0)
            for n, s in step["tenants"].items():
                gaps = metrics.itl_in_window([r for r in measured if r.tenant == n], *window)
                s["itl_ms"] = metrics.distribution(gaps, 1000.0)
        by_conc.append(step)
    plan = meta.get("plan") or {}
    summary = {
        "run": {
            "host": meta.get("host"), "grpc_url": meta.get("grpc_url"), "plan": plan,
            "seed": meta.get("seed"), "warmup_s": meta.get("warmup_s"), "workers": meta.get("workers"),
            "started": meta.get("started"), "ended": meta.get("ended"),
            "tenants_file": (meta.get("tenants") or {}).get("path"),
            "requests_recorded": len(records), "warmup_excluded": len(records) - len(measured),
        },
        "overall": metrics.summarize(measured, slos, window),
        "tenants": by_tenant,
        "by_concurrency": by_conc,
    }
    if plan.get("shape") == "poisson":
        lags = [r.sched_lag for r in measured if r.sched_lag is not None]
        dur = summary["overall"]["duration_s"]
        summary["arrivals"] = {
            "target_rate_rps": plan.get("rate"),
            "achieved_rate_rps": len(measured) / dur if dur else None,
            "schedule_lag_ms": metrics.distribution(lags, 1000.0),
        }
    return summary


def steps_between(before: dict | None, after: dict | None) -> dict | None:
    """The engine's steps between two readings of the server's /metrics (`loadtest.run.engine_steps`): how many,
    their mean tokens and milliseconds, the tokens a second of stepping, the share at most each bucket's bound, the
    smallest bound that half of them fit, the preemptions, and the prompt tokens admitted and those taken from the
    prefix cache."""
    if before is None or after is None:
        return None
    b, a = before["steps"], after["steps"]
    steps = a["count"] - b["count"]
    if steps <= 0:
        return None
    at_most = {le: (a["le"][le] - b["le"].get(le, 0.0)) / steps for le in sorted(a["le"])}
    tokens, seconds = a["sum"] - b["sum"], a.get("seconds", 0.0) - b.get("seconds", 0.0)
    return {"steps": int(steps), "mean_tokens": tokens / steps, "mean_ms": 1e3 * seconds / steps,
            "tokens_per_s": tokens / seconds if seconds > 0 else None,
            "share_at_most": {f"{le:g}": share for le, share in at_most.items()},
            "p50_tokens_at_most": next(le for le, share in at_most.items() if share >= 0.5),
            **{key: int(after[key] - before[key])
               for key in ("preemptions", "prompt_tokens", "prefix_cache_hit_tokens")}}


def stage_steps(by_concurrency: list[dict], meta: dict, readings: list) -> None:
    """Each step of users with a stage window gets `server_steps`: `steps_between` the first reading in its window
    and the last (`readings`: [wall time, engine_steps] through the run, server_steps.json's), and `busy_share`, the
    share of the time between them that the engine spent in steps."""
    for step in by_concurrency:
        window = stage_window(step["users"], meta)
        inside = [(t, r) for t, r in readings if window is not None and window[0] <= t <= window[1]]
        steps = steps_between(inside[0][1], inside[-1][1]) if len(inside) >= 2 else None
        if steps is not None:
            busy_s = steps["steps"] * steps["mean_ms"] / 1e3
            step["server_steps"] = {**steps, "busy_share": busy_s / (inside[-1][0] - inside[0][0])}


def read_readings(path: Path) -> list:
    """server_steps.json's readings, their buckets' bounds numbers again (JSON keeps them as strings)."""
    if not path.is_file():
        return []
    readings = json.loads(path.read_text()).get("readings") or []
    for _, r in readings:
        r["steps"]["le"] = {float(le): n for le, n in r["steps"]["le"].items()}
    return readings


# ------------------------------------------------------------------------------------------------
# Plots
# ------------------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes)


def plot_itl_vs_concurrency(summary: dict, path: Path) -> None:
    plt = _plt()
    groups = ["overall"] + list(summary["tenants"])
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 3.8), squeeze=False, sharey=True)
    for ax, g in zip(axes[0], groups):
        pts = [(c["users"], (c["overall"] if g == "overall" else c["tenants"].get(g, {})).get("itl_ms"))
               for c in summary["by_concurrency"] if c["users"] is not None]
        pts = [(u, d) for u, d in pts if d and d["count"]]
        if not pts:
            _no_data(ax, "ITL samples")
        for p, style in zip(metrics.PERCENTILES, ("o-", "s--", "^-.", "v:")):
            ax.plot([u for u, _ in pts], [d[f"p{p}"] for _, d in pts], style, label=f"p{p}")
        ax.set_title(f"ITL: {g}")
        ax.set_xlabel("concurrency (users)")
        ax.grid(alpha=0.3)
        if pts:
            ax.set_xticks(sorted({u for u, _ in pts}))
    axes[0][0].set_ylabel("inter-token latency (ms)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ttft_distribution(records: list[metrics.RequestRecord], tenants: list[str], path: Path) -> None:
    plt = _plt()
    fig, (h, c) = plt.subplots(1, 2, figsize=(10, 3.8))
    ttfts = {name: sorted(m.ttft * 1000.0 for m in (metrics.derive(r) for r in records if r.tenant == name)
                          if m.ok and m.ttft is not None) for name in tenants}
    everything = [x for xs in ttfts.values() for x in xs]
    any_data = bool(everything)
    if any_data:  # one set of bins for every tenant, so the histograms compare
        lo, hi = min(everything), max(everything)
        nb = min(40, max(5, len(everything) // 4))
        edges = [lo + (hi - lo) * i / nb for i in range(nb + 1)] if hi > lo else [lo - 0.5, hi + 0.5]
    for name, xs in ttfts.items():
        if not xs:
            continue
        h.hist(xs, bins=edges, histtype="step", linewidth=1.5, label=name)
        c.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=name)
    if not any_data:
        _no_data(h, "TTFT samples")
    h.set_title("TTFT histogram")
    h.set_xlabel("time to first token (ms)")
    h.set_ylabel("requests")
    c.set_title("TTFT cumulative distribution")
    c.set_xlabel("time to first token (ms)")
    c.set_ylabel("share of requests")
    for ax in (h, c):
        ax.grid(alpha=0.3)
        if any_data:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_tokens_per_s(records: list[metrics.RequestRecord], tenants: list[str], meta: dict, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ok = [r for r in records if r.ok]
    t0 = meta.get("started") or (min(r.t_start for r in records) if records else 0.0)
    span = max((r.t_start + (r.t_end or 0.0) - t0 for r in ok), default=0.0)
    bin_s = max(1.0, round(span / 60.0))
    for name in tenants:
        xs, ys = metrics.throughput_timeline([r for r in ok if r.tenant == name], t0, bin_s)
        if xs:
            ax.plot(xs, ys, drawstyle="steps-mid", label=name)
    xs, ys = metrics.throughput_timeline(ok, t0, bin_s)
    if xs and len(tenants) > 1:
        ax.plot(xs, ys, drawstyle="steps-mid", color="black", linewidth=1, alpha=0.6, label="all tenants")
    if not xs:
        _no_data(ax, "output tokens")
    warm = meta.get("warmup_s") or 0.0
    if warm:
        ax.axvspan(0, warm, color="grey", alpha=0.15, label="warm-up (excluded)")
    for s in (meta.get("plan") or {}).get("stages", [])[1:]:
        ax.axvline(s["start_s"], color="grey", linestyle=":", linewidth=1)
    ax.set_title(f"output tokens/s over time ({bin_s:g} s bins)")
    ax.set_xlabel("seconds since test start")
    ax.set_ylabel("output tokens/s")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency_by_tenant(summary: dict, path: Path) -> None:
    plt = _plt()
    names = list(summary["tenants"])
    metrics_ = [("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")]
    fig, axes = plt.subplots(1, len(metrics_), figsize=(4 * len(metrics_), 3.6))
    width = 0.8 / max(1, len(names))
    for ax, (key, title) in zip(axes, metrics_):
        for i, name in enumerate(names):
            d = summary["tenants"][name][key]
            vals = [d[f"p{p}"] or 0.0 for p in metrics.PERCENTILES]
            ax.bar([j + i * width for j in range(len(vals))], vals, width, label=name)
        ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(metrics.PERCENTILES))])
        ax.set_xticklabels([f"p{p}" for p in metrics.PERCENTILES])
        ax.set_title(f"{title} (ms)")
        ax.grid(alpha=0.3, axis="y")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=max(1, len(names)), fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------
# Markdown
# ------------------------------------------------------------------------------------------------


def _pct(share: float | None) -> float | None:
    return None if share is None else 100 * share


def _f(v, nd=1) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def _latency_rows(groups: dict[str, dict]) -> list[str]:
    rows = ["| group | metric | count | mean | p50 | p90 | p95 | p99 | max |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for g, s in groups.items():
        for key, label in (("ttft_ms", "TTFT ms"), ("itl_ms", "ITL ms"), ("tpot_ms", "TPOT ms"), ("e2e_ms", "E2E ms"),
                           ("tokens_per_s_user", "tokens/s/user")):
            d = s[key]
            rows.append(f"| {g} | {label} | {d['count']} | {_f(d['mean'])} | " +
                        " | ".join(_f(d[f'p{p}']) for p in metrics.PERCENTILES) + f" | {_f(d['max'])} |")
    return rows


def render_markdown(summary: dict) -> str:
    run = summary["run"]
    plan = run.get("plan") or {}
    groups = {"overall": summary["overall"], **summary["tenants"]}
    lines = [
        "# Load test report", "",
        f"- host: `{run.get('host')}` (gRPC `{run.get('grpc_url')}`), workers: {run.get('workers')}",
        f"- shape: **{plan.get('shape')}**, stages (users): {[s['users'] for s in plan.get('stages', [])]}"
        + (f", target rate {plan.get('rate')} req/s" if plan.get("shape") == "poisson" else "")
        + f", run time {plan.get('run_time_s')} s, warm-up {run.get('warmup_s')} s excluded",
        f"- tenants file: `{run.get('tenants_file')}`, seed {run.get('seed')}",
        f"- requests recorded: {run['requests_recorded']} ({run['warmup_excluded']} in warm-up, excluded)",
        "",
        "Percentiles are exact (linear interpolation) over every measured request in `requests.jsonl`.",
        "ITL = every gap between token-carrying pieces; TPOT = (E2E - TTFT) / (tokens - 1); "
        "tokens/s/user = 1 / TPOT.", "",
        "## Throughput, goodput, failures", "",
        "| group | model | protocol | requests | ok | output tok | output tok/s | req/s | goodput | SLO | failures |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for g, s in groups.items():
        fails = ", ".join(f"{k} {v}" for k, v in s["failures"].items() if v) or "none"
        gp = s["goodput"]
        slo = s.get("slo")
        slo_txt = ", ".join(f"{k} ≤ {v}" for k, v in slo.items()) if slo else ("per tenant" if g == "overall" else "–")
        lines.append(f"| {g} | {s.get('model') or ''} | {s.get('protocol') or ''} | {s['requests']} | {s['ok']} | "
                     f"{s['output_tokens']} | {_f(s['output_throughput_tok_s'])} | {_f(s['request_throughput_rps'], 2)} | "
                     f"{_f(100 * gp['share'] if gp['share'] is not None else None)} % | {slo_txt} | {fails} |")
    lines += ["", "## Latency (ms)", ""] + _latency_rows(groups)
    if len(summary["by_concurrency"]) > 1 or plan.get("shape") == "steps":
        steps = any(c.get("server_steps") for c in summary["by_concurrency"])  # the server's steps, where read
        lines += ["", "## By concurrency", "",
                  "| users | requests | TTFT p50 | TTFT p99 | ITL p50 | ITL p90 | ITL p95 | ITL p99 | TPOT p50 | output tok/s |"
                  + (" engine step ms | engine busy |" if steps else ""),
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if steps else "")]
        for c in summary["by_concurrency"]:
            o, st = c["overall"], c.get("server_steps") or {}
            lines.append(f"| {c['users']} | {o['requests']} | {_f(o['ttft_ms']['p50'])} | {_f(o['ttft_ms']['p99'])} | "
                         + " | ".join(_f(o['itl_ms'][f'p{p}']) for p in metrics.PERCENTILES)
                         + f" | {_f(o['tpot_ms']['p50'])} | {_f(o['output_throughput_tok_s'])} |"
                         + (f" {_f(st.get('mean_ms'), 2)} | {_f(_pct(st.get('busy_share')))} % |" if steps else ""))
        if steps:
            lines += ["", "Engine step: the mean wall time of the engine's steps in the server over the stage; busy: "
                      "the share of the stage's time it spent in them (both from the server's /metrics, which it "
                      "updates every 0.5 s: a few percent either way). Inter-token gaps longer than the step are time "
                      "the server spends between steps."]
        if len(summary["tenants"]) > 1:
            lines += ["", "Per tenant:", "",
                      "| users | tenant | requests | TTFT p50 | ITL p50 | ITL p90 | ITL p99 | TPOT p50 | TPOT p90 | output tok/s |",
                      "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for c in summary["by_concurrency"]:
                for name, t in c["tenants"].items():
                    lines.append(f"| {c['users']} | {name} | {t['requests']} | {_f(t['ttft_ms']['p50'])} | "
                                 f"{_f(t['itl_ms']['p50'])} | {_f(t['itl_ms']['p90'])} | {_f(t['itl_ms']['p99'])} | "
                                 f"{_f(t['tpot_ms']['p50'])} | {_f(t['tpot_ms']['p90'])} | "
                                 f"{_f(t['output_throughput_tok_s'])} |")
    if "arrivals" in summary:
        a = summary["arrivals"]
        lag = a["schedule_lag_ms"]
        lines += ["", "## Arrivals (Poisson)", "",
                  f"- target {a['target_rate_rps']} req/s, achieved {_f(a['achieved_rate_rps'], 3)} req/s",
                  f"- schedule lag (actual send - scheduled send): p50 {_f(lag['p50'])} ms, p90 {_f(lag['p90'])} ms, "
                  f"p99 {_f(lag['p99'])} ms, max {_f(lag['max'])} ms (large lag: the user pool `-u` is too small "
                  "or the load generator is saturated)"]
    lines += ["", "## Plots", ""]
    for key, fname in PLOTS.items():
        lines += [f"![{key}]({fname})", ""]
    return "\n".join(lines)


def write_report(out_dir: str | Path) -> dict:
    """Read requests.jsonl and run.json in `out_dir`; write summary.json, report.md and the plots there."""
    out = Path(out_dir)
    records = read_records(out / REQUESTS_FILE) if (out / REQUESTS_FILE).is_file() else []
    meta = read_run_meta(out)
    summary = build_summary(records, meta)
    stage_steps(summary["by_concurrency"], meta, read_readings(out / STEPS_FILE))
    summary["files"] = {"requests": REQUESTS_FILE, "report": REPORT_FILE, "plots": dict(PLOTS)}
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    measured = [r for r in records if not r.warmup]
    tenants = list(summary["tenants"])
    plot_itl_vs_concurrency(summary, out / PLOTS["itl_vs_concurrency"])
    plot_ttft_distribution(measured, tenants, out / PLOTS["ttft_distribution"])
    plot_tokens_per_s(records, tenants, meta, out / PLOTS["tokens_per_s"])
    plot_latency_by_tenant(summary, out / PLOTS["latency_by_tenant"])
    (out / REPORT_FILE).write_text(render_markdown(summary) + "\n", encoding="utf-8")
    return summary


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", help="folder holding requests.jsonl and run.json")
    args = p.parse_args(argv)
    s = write_report(args.out_dir)
    o = s["overall"]
    print(f"{o['requests']} requests, {o['failed']} failed; TTFT p50 {_f(o['ttft_ms']['p50'])} ms, "
          f"ITL p50 {_f(o['itl_ms']['p50'])} ms, {_f(o['output_throughput_tok_s'])} output tok/s "
          f"-> {Path(args.out_dir) / REPORT_FILE}")


if __name__ == "__main__":
    main()
