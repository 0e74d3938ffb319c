"""Per-request LLM serving metrics, computed exactly from raw timings (no Locust, no numpy).

One streamed request is a `RequestRecord`: when it was sent, and for every streamed piece the time
it arrived (seconds after the send) and how many output tokens it carried. Everything else is
derived from that by `derive()`:

    ttft   = arrival of the first piece that carries >= 1 token
    itl    = every gap between consecutive token-carrying pieces (vLLM benchmark_serving's ITL:
             a piece with n > 1 tokens is one gap, not n)
    e2e    = arrival of the last piece (the final response / end of stream)
    tpot   = (e2e - ttft) / (tokens - 1)                       only when tokens > 1
    tokens_per_s_user = (tokens - 1) / (e2e - ttft) = 1 / tpot  decode speed one user sees

`summarize()` turns a list of records into the numbers in summary.json: exact percentiles
(linear interpolation between closest ranks, the same as numpy.percentile's default), output
token throughput over the measured window, goodput against per-tenant SLOs, and failures by kind.
The JSONL of records is the source of truth; Locust's live statistics only mirror it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

PERCENTILES = (50, 90, 95, 99)

# Failure kinds, in the order a request can meet them.
CONNECT = "connect"  # no connection / gRPC UNAVAILABLE before anything came back
HTTP = "http"  # rejected before any output: non-200 status, or a gRPC error before the first piece
STREAM_ERROR = "stream_error"  # an error event/response after the stream had started (Triton: under HTTP 200)
TRUNCATED = "truncated"  # the stream ended early: connection broke mid-body, no final response, no tokens
TIMEOUT = "timeout"  # the request ran past its deadline (client side)
FAILURE_KINDS = (CONNECT, HTTP, STREAM_ERROR, TRUNCATED, TIMEOUT)
# Not a failure of the server: the client dropped the stream on purpose (a tenant's `cancel`).
CANCELLED = "cancelled"

# What a request was built to provoke (a tenant's `cancel` / `invalid`), and the outcomes that meet it.
EXPECT_CANCEL = "cancel"  # the client drops the stream mid-way: CANCELLED (or ok, had it already ended)
EXPECT_INVALID = "invalid"  # a bad request: refused before any output (HTTP 400 / gRPC INVALID_ARG)


@dataclass
class RequestRecord:
    """Raw facts about one request: one JSON line in requests.jsonl."""

    tenant: str
    protocol: str  # "grpc" | "http"
    model: str
    request_id: str
    t_start: float  # wall clock (epoch seconds) when the request was sent
    piece_t: list[float] = field(default_factory=list)  # arrival of each piece, seconds after the send
    piece_tokens: list[int] = field(default_factory=list)  # output tokens carried by each piece
    t_end: float | None = None  # seconds after the send when the request ended (success or failure)
    error_kind: str | None = None  # one of FAILURE_KINDS, None on success
    error: str | None = None
    finish_reason: str | None = None
    num_input_tokens: int | None = None  # as reported by the server
    tokens_from_server: bool = True  # False: the server gave no num_output_tokens, one token per piece assumed
    max_tokens: int | None = None
    prompt_seq: int | None = None  # index of the prompt in the tenant's seeded sequence
    prompt_words: int | None = None
    users: int | None = None  # users running in this process when the request was sent
    sched_lag: float | None = None  # Poisson arrivals: actual send - scheduled send, seconds
    warmup: bool = False
    worker: int = 0
    expect: str | None = None  # None: an ordinary request; EXPECT_CANCEL | EXPECT_INVALID
    invalid_kind: str | None = None  # the kind of bad request (tenants.INVALID_KINDS)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RequestRecord":
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def ok(self) -> bool:
        return self.error_kind is None


def outcome_of(rec: RequestRecord) -> str:
    """The request's outcome in words: "ok", "cancelled", "refused" (a bad request answered with an
    error before any output, as it should be), "accepted" (a bad request that was served), or the
    failure kind."""
    if rec.expect == EXPECT_INVALID:
        if rec.error_kind == HTTP and not rec.piece_t:
            return "refused"
        return "accepted" if rec.ok else rec.error_kind
    return "ok" if rec.ok else rec.error_kind


def expected(rec: RequestRecord) -> bool:
    """Whether the outcome is the one the request was built for: ok for an ordinary request; cancelled
    (or ok: it ended before the client dropped it) for a cancel; refused for a bad request."""
    o = outcome_of(rec)
    if rec.expect == EXPECT_INVALID:
        return o == "refused"
    if rec.expect == EXPECT_CANCEL:
        return o in ("ok", CANCELLED)
    return o == "ok"


@dataclass(frozen=True)
class RequestMetrics:
    """Derived per-request metrics, seconds."""

    ok: bool
    output_tokens: int
    ttft: float | None
    e2e: float | None
    tpot: float | None
    itl: tuple[float, ...]
    tokens_per_s_user: float | None


def derive(rec: RequestRecord) -> RequestMetrics:
    """Derive TTFT, ITL gaps, TPOT, E2E and per-user decode speed from one record's timings."""
    if len(rec.piece_t) != len(rec.piece_tokens):
        raise ValueError(f"{rec.request_id}: {len(rec.piece_t)} piece times but {len(rec.piece_tokens)} token counts")
    if any(b < a for a, b in zip(rec.piece_t, rec.piece_t[1:])):
        raise ValueError(f"{rec.request_id}: piece arrival times are not monotonic")
    token_times = [t for t, n in zip(rec.piece_t, rec.piece_tokens) if n > 0]
    tokens = sum(rec.piece_tokens)
    ttft = token_times[0] if token_times else None
    itl = tuple(b - a for a, b in zip(token_times, token_times[1:]))
    if not rec.ok:
        return RequestMetrics(False, tokens, ttft, None, None, itl, None)
    e2e = rec.t_end if rec.t_end is not None else (rec.piece_t[-1] if rec.piece_t else None)
    if e2e is not None and rec.piece_t:
        e2e = max(e2e, rec.piece_t[-1])
    tpot = (e2e - ttft) / (tokens - 1) if (ttft is not None and e2e is not None and tokens > 1) else None
    tps = (1.0 / tpot) if tpot else None
    return RequestMetrics(True, tokens, ttft, e2e, tpot, itl, tps)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Exact q-th percentile (0..100), linear interpolation between closest ranks (numpy's default)."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside [0, 100]")
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: Sequence[float], scale: float = 1.0) -> dict:
    """count, mean, min, max and p50/p90/p95/p99 of `values` times `scale` (1000.0: seconds to ms)."""
    xs = [v * scale for v in values]
    out: dict = {"count": len(xs)}
    if not xs:
        out.update({"mean": None, "min": None, "max": None, **{f"p{p}": None for p in PERCENTILES}})
        return out
    out.update({"mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs)})
    out.update({f"p{p}": percentile(xs, p) for p in PERCENTILES})
    return out


def meets_slo(m: RequestMetrics, slo: dict | None) -> bool:
    """A request is "good" when it succeeded and its TTFT and TPOT (ms) are within the tenant's SLOs.

    A TPOT SLO does not apply to a one-token answer (TPOT undefined), as in vLLM's goodput.
    """
    if not m.ok:
        return False
    slo = slo or {}
    if slo.get("ttft_ms") is not None and (m.ttft is None or m.ttft * 1000.0 > slo["ttft_ms"]):
        return False
    if slo.get("tpot_ms") is not None and m.tpot is not None and m.tpot * 1000.0 > slo["tpot_ms"]:
        return False
    if slo.get("e2e_ms") is not None and (m.e2e is None or m.e2e * 1000.0 > slo["e2e_ms"]):
        return False
    return True


def measured_window(records: Sequence[RequestRecord]) -> tuple[float, float] | None:
    """(first send, last end) over the records, wall clock seconds: the span throughput is taken over."""
    if not records:
        return None
    start = min(r.t_start for r in records)
    end = max(r.t_start + (r.t_end if r.t_end is not None else (r.piece_t[-1] if r.piece_t else 0.0)) for r in records)
    return start, end


def itl_in_window(records: Iterable[RequestRecord], start: float, end: float) -> list[float]:
    """ITL gaps (seconds) of the ok records whose later token arrived in [start, end), wall clock: a load step's
    gaps by when they happened, whichever step sent their request (one sent late in a light step streams into
    the heavier next one)."""
    gaps = []
    for r in records:
        if r.ok:
            times = [r.t_start + t for t, n in zip(r.piece_t, r.piece_tokens) if n > 0]
            gaps += [b - a for a, b in zip(times, times[1:]) if start <= b < end]
    return gaps


def summarize(records: Iterable[RequestRecord], slos: dict[str, dict] | None = None,
              window: tuple[float, float] | None = None) -> dict:
    """Summary of one group of (non-warm-up) records: latencies in ms, throughput, goodput, failures.

    `slos` maps tenant name -> {"ttft_ms": .., "tpot_ms": ..}; each request is judged by its own
    tenant's SLOs. `window` (wall clock start, end) defaults to first send .. last end.
    """
    records = list(records)
    slos = slos or {}
    derived = [(r, derive(r)) for r in records]
    ok = [m for _, m in derived if m.ok]
    failures = {k: 0 for k in FAILURE_KINDS}
    for r in records:
        if r.error_kind is not None:
            failures[r.error_kind] = failures.get(r.error_kind, 0) + 1
    window = window or measured_window(records)
    duration = (window[1] - window[0]) if window else 0.0
    out_tokens = sum(m.output_tokens for m in ok)
    in_tokens = [r.num_input_tokens for r in records if r.ok and r.num_input_tokens is not None]
    good = sum(1 for r, m in derived if meets_slo(m, slos.get(r.tenant)))
    return {
        "requests": len(records),
        "ok": len(ok),
        "failed": len(records) - len(ok),
        "failures": failures,
        "duration_s": duration,
        "ttft_ms": distribution([m.ttft for m in ok if m.ttft is not None], 1000.0),
        "itl_ms": distribution([g for m in ok for g in m.itl], 1000.0),
        "tpot_ms": distribution([m.tpot for m in ok if m.tpot is not None], 1000.0),
        "e2e_ms": distribution([m.e2e for m in ok if m.e2e is not None], 1000.0),
        "tokens_per_s_user": distribution([m.tokens_per_s_user for m in ok if m.tokens_per_s_user is not None]),
        "output_tokens": out_tokens,
        "output_tokens_per_request": distribution([m.output_tokens for m in ok]),
        "input_tokens_per_request": distribution(in_tokens),
        "output_throughput_tok_s": out_tokens / duration if duration > 0 else None,
        "request_throughput_rps": len(ok) / duration if duration > 0 else None,
        "goodput": {
            "good": good,
            "total": len(records),
            "share": good / len(records) if records else None,
            "rate_rps": good / duration if duration > 0 else None,
        },
    }


def throughput_timeline(records: Sequence[RequestRecord], t0: float, bin_s: float = 1.0) -> tuple[list[float], list[float]]:
    """Output tokens/s in consecutive `bin_s` bins from wall time `t0`, each token counted when its piece arrived."""
    ends = [r.t_start + t - t0 for r in records for t, n in zip(r.piece_t, r.piece_tokens) if n > 0]
    if not ends:
        return [], []
    nbins = int(max(ends) // bin_s) + 1
    counts = [0.0] * nbins
    for r in records:
        for t, n in zip(r.piece_t, r.piece_tokens):
            at = r.t_start + t - t0
            if n > 0 and at >= 0:
                counts[int(at // bin_s)] += n
    return [(i + 0.5) * bin_s for i in range(nbins)], [c / bin_s for c in counts]
