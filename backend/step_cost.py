"""How many prompt tokens fit in a step that should last at most `target_ms`, or at most `target_ratio` times a
decode-only step of the running batch (stall-free batching; with both, the smaller).

A step carries every running decode first, then prefill chunks. Its time is modelled as a function of the
tokens it carries, learned from the steps the engine has run: running means of (tokens, ms) in buckets about
19% wide. The curve is concave where it matters (a MoE step reads most of its weights once whatever its
tokens, so a step of 8 decodes costs 2x one decode and a 256-token step 1.4x a 32-token one on the H200),
so a per-token slope measured on small steps would price big chunks far too high. Between measured points
the estimate interpolates. Past the largest it follows the chord from the smallest, which a concave curve
never exceeds there (a budget found there is safe, and the next step measures it); below the smallest it is in
proportion to the tokens, which a concave curve through the origin never falls short of there (a decode step
not yet measured is not overstated in a ratio target). Before anything is measured, chunks beside decodes are
small rather than stalling the streams.

The curve must heal from steps that say nothing of later ones (a kernel compiled or a graph captured on first
use, the host paused): one such step, taken whole, priced its size and every larger one out of reach, so steps
that size never ran again to correct it (H100 serving, 2026-12-05: prompts then progressed 16 tokens a step
beside decodes). So a step counts as at most `OUTLIER` times its estimate (a lasting change is still followed,
by up to that factor a step), a size not measured for `FORGET_AFTER` steps leaves the curve (the budget then
tries it again), and the engine ignores its first steps, which compile kernels before any estimate exists.
"""
from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field

SMOOTHING = 0.2  # weight of the newest step in a bucket's running means: follows a changing batch in ~5 steps
BUCKETS_PER_OCTAVE = 4
OUTLIER = 2.0        # a step counts as at most this many times its estimate
FORGET_AFTER = 200   # steps after which a bucket not measured since leaves the curve


@dataclass
class StepCost:
    target_ms: float | None = None
    target_ratio: float | None = None  # relative to a decode-only step: the streams' inter-token p99 over p50
    min_chunk: int = 16  # prompt tokens a step always takes, so prompts progress under any target
    warmup_steps: int = 0  # the first steps observed are ignored
    curve: dict[int, tuple[float, float]] = field(default_factory=dict)  # bucket -> (mean tokens, mean ms)
    measured_at: dict[int, int] = field(default_factory=dict)  # bucket -> the step that last measured it
    steps: int = 0  # steps observed

    def estimate_ms(self, tokens: int) -> float | None:
        """A step of `tokens` tokens (decodes and prompt tokens alike), or None before any step is measured."""
        return _estimate(self._points(), tokens) if self.curve else None

    def _points(self) -> tuple[list[float], list[float]]:
        """The curve's points in order of tokens: (tokens, ms), the ms made non-decreasing (more tokens never
        cost less)."""
        points = [self.curve[b] for b in sorted(self.curve)]
        return [x for x, _ in points], list(itertools.accumulate((y for _, y in points), max))

    def prefill_budget(self, num_decode: int, max_tokens: int) -> int:
        """Prompt tokens for the next step, which carries `num_decode` decodes, of at most `max_tokens`."""
        room = max_tokens - num_decode
        if num_decode == 0:  # nobody streams, so nobody stalls
            return room
        floor = min(room, self.min_chunk)
        if not self.curve:  # nothing measured yet
            return floor
        points = self._points()  # once: the search below estimates a dozen steps
        decode_ms = _estimate(points, num_decode)
        target = self.target_ms if self.target_ms is not None else float("inf")
        if self.target_ratio is not None:
            target = min(target, self.target_ratio * decode_ms)
        lo, hi = 0, room  # the most prompt tokens whose step fits the target (the estimate grows with tokens)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _estimate(points, num_decode + mid) <= target:
                lo = mid
            else:
                hi = mid - 1
        return max(floor, lo)

    def observe(self, num_tokens: int, ms: float) -> None:
        self.steps += 1
        if self.steps <= self.warmup_steps:
            return
        for stale in [b for b, step in self.measured_at.items() if self.steps - step > FORGET_AFTER]:
            del self.curve[stale], self.measured_at[stale]
        if self.curve:  # (below the smallest step measured, its time bounds the step's, not the proportion)
            xs, ys = self._points()
            ms = min(ms, OUTLIER * (ys[0] if num_tokens < xs[0] else _estimate((xs, ys), num_tokens)))
        bucket = round(BUCKETS_PER_OCTAVE * math.log2(num_tokens))
        self.measured_at[bucket] = self.steps
        old = self.curve.get(bucket)
        self.curve[bucket] = (num_tokens, ms) if old is None else (
            (1 - SMOOTHING) * old[0] + SMOOTHING * num_tokens, (1 - SMOOTHING) * old[1] + SMOOTHING * ms)


def _estimate(points: tuple[list[float], list[float]], tokens: int) -> float:
    xs, ys = points
    if tokens >= xs[-1]:  # the chord from the smallest point on (from the origin while only one is known)
        x0, y0 = (xs[0], ys[0]) if len(xs) > 1 else (0.0, 0.0)
        return ys[-1] + (ys[-1] - y0) / (xs[-1] - x0) * (tokens - xs[-1])
    if tokens <= xs[0]:
        return ys[0] * tokens / xs[0]
    i = bisect.bisect_right(xs, tokens)
    (x0, y0), (x1, y1) = (xs[i - 1], ys[i - 1]), (xs[i], ys[i])
    return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
