"""How many prompt tokens fit in a step that should last at most `target_ms`, or at most `target_ratio` times a
decode-only step of the running batch (stall-free batching; with both, the smaller).

A step carries every running decode first, then prefill chunks. Its time is modelled from the
steps the engine has run: `decode_ms`, a running mean over steps that carried only decodes, and
`prefill_ms_per_token`, a running mean of what each prompt token added on top of that. Before
either is known the estimates are pessimistic (no decode baseline: a prompt token pays for the
whole step), so the first chunks come out small rather than stalling the streams.
"""
from __future__ import annotations

from dataclasses import dataclass

SMOOTHING = 0.2  # weight of the newest step in the running means: follows a changing batch in ~5 steps


@dataclass
class StepCost:
    target_ms: float | None = None
    target_ratio: float | None = None  # relative to `decode_ms`: the streams' inter-token p99 over p50, roughly
    min_chunk: int = 16  # prompt tokens a step always takes, so prompts progress under any target
    decode_ms: float | None = None
    prefill_ms_per_token: float | None = None

    def prefill_budget(self, num_decode: int, max_tokens: int) -> int:
        """Prompt tokens for the next step, which carries `num_decode` decodes, of at most `max_tokens`."""
        room = max_tokens - num_decode
        if num_decode == 0 or self.prefill_ms_per_token is None:
            # nobody streams yet, so nobody stalls; or nothing measured yet: take the whole room
            # when alone, a minimal chunk beside decodes
            return room if num_decode == 0 else min(room, self.min_chunk)
        target = self.target_ms if self.target_ms is not None else float("inf")
        if self.target_ratio is not None and self.decode_ms is not None:
            target = min(target, self.target_ratio * self.decode_ms)
        if target == float("inf"):  # a ratio without a decode step measured yet
            return min(room, self.min_chunk)
        spare = target - (self.decode_ms or 0.0)
        return max(min(room, self.min_chunk), min(room, int(spare / self.prefill_ms_per_token)))

    def observe(self, num_decode: int, num_prefill: int, ms: float) -> None:
        if num_prefill == 0:
            self.decode_ms = _mean(self.decode_ms, ms)
            return
        base = self.decode_ms if num_decode and self.decode_ms is not None else 0.0
        self.prefill_ms_per_token = _mean(self.prefill_ms_per_token, max(ms - base, 0.0) / num_prefill)


def _mean(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new
