"""Sampling parameters (validated at the door) and the per-step sampler."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import torch

from backend.structured import check_response_format

# What any request may ask, whatever the engine (README "Limits"): checked at the door, before tokenizing.
MAX_PROMPT_BYTES = 1 << 20     # UTF-8 bytes of a prompt; an engine's own bound is usually lower (RequestLimits)
MAX_STOP_STRINGS = 16
SHOWN_CHARS = 80  # of a refused value, in its error message
MAX_STOP_STRING_CHARS = 256    # each stop string; held-back text and the stop search scale with it
MAX_STOP_TOKEN_IDS = 64        # searched on every sampled token
# Temperatures below this sample greedily: dividing logits by 1e-300 overflows to inf/NaN (vLLM's rule too).
GREEDY_TEMPERATURE = 1e-5


def short(value) -> str:
    """repr of a refused value for an error message: bounded, and never raising."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4,300-digit conversion limit
        text = f"<int of {value.bit_length()} bits>" if isinstance(value, int) else f"<{type(value).__name__}>"
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} chars)"


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask of an engine (`LLMEngine.limits`): checked by `SamplingParams.validate`."""
    max_model_len: int       # prompt + output tokens
    vocab_size: int          # bounds top_k and stop_token_ids
    max_output_tokens: int   # bounds max_tokens
    # a longer prompt needs more than max_model_len tokens: refused before it is tokenized
    # (tokenizing 1 MiB takes ~1.3 s of the thread that streams every response)
    max_prompt_bytes: int = MAX_PROMPT_BYTES


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0   # 0 (or below GREEDY_TEMPERATURE) means greedy
    top_p: float = 1.0
    top_k: int = 0             # 0 or -1: no top-k
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # structured output (backend/structured.py): OpenAI's {"type": "json_schema", "json_schema": {"schema": ...}},
    # {"type": "json_object"}, or {"type": "regex", "regex": ...}
    response_format: dict | None = None

    @classmethod
    def from_dict(cls, d: dict, limits: RequestLimits | None = None) -> "SamplingParams":
        """Build from JSON-like input; ValueError names the offending key and value."""
        if not isinstance(d, Mapping):
            raise ValueError(f"sampling parameters must be a JSON object, not {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(map(short, set(d) - names))  # keys of any type, shown and sorted as text
        if unknown:
            shown = ", ".join(unknown[:8]) + (f", ... ({len(unknown)} in all)" if len(unknown) > 8 else "")
            raise ValueError(f"unknown sampling parameter(s) [{shown}]; allowed: {sorted(names)}")
        p = cls(**{k: v for k, v in d.items()})
        p.validate(limits)
        return p

    def validate(self, limits: RequestLimits | None = None):
        """Every check of a request's sampling parameters, against an engine's limits when given."""
        vocab_size = limits.vocab_size if limits else None

        def bad(key, why):
            raise ValueError(f"sampling parameter {key!r}={short(getattr(self, key))}: {why}")

        def is_int(x):
            return isinstance(x, int) and not isinstance(x, bool)

        def is_num(x):
            return isinstance(x, (int, float)) and not isinstance(x, bool)

        if not is_int(self.max_tokens) or not 1 <= self.max_tokens <= 1 << 20:
            bad("max_tokens", "must be an integer >= 1")
        if limits and self.max_tokens > limits.max_output_tokens:
            bad("max_tokens", f"this model generates at most {limits.max_output_tokens} tokens per request "
                              f"(max_model_len {limits.max_model_len})")
        if not is_num(self.temperature) or not 0 <= self.temperature <= 100:
            bad("temperature", "must be a number in [0, 100]")
        if not is_num(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", "must be a number in (0, 1]")
        if not is_int(self.top_k) or self.top_k < -1 or (vocab_size and self.top_k > vocab_size):
            bad("top_k", f"must be an integer in [-1, {vocab_size or 'vocab size'}]")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed < 1 << 63):
            bad("seed", "must be a non-negative integer")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if (not isinstance(self.stop, list) or len(self.stop) > MAX_STOP_STRINGS
                or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_STRING_CHARS for s in self.stop)):
            bad("stop", f"must be a non-empty string or a list of at most {MAX_STOP_STRINGS} non-empty strings "
                        f"of at most {MAX_STOP_STRING_CHARS} characters")
        if not isinstance(self.stop_token_ids, list) or len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS or not all(
                is_int(t) and 0 <= t < (vocab_size or 1 << 31) for t in self.stop_token_ids):
            bad("stop_token_ids", f"must be a list of at most {MAX_STOP_TOKEN_IDS} token ids within the vocabulary")
        if not isinstance(self.ignore_eos, bool):
            bad("ignore_eos", "must be a boolean")
        try:
            self.response_format = check_response_format(self.response_format)
        except ValueError as e:
            bad("response_format", str(e))
        self.temperature, self.top_p = float(self.temperature), float(self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int | Exception]:
    """One token per row of logits [B, V]; greedy rows take the argmax. A row whose sampling fails
    gets its exception in place of a token, so one request's failure is that request's alone."""
    if all(p.greedy for p in params):  # one device sync for the whole batch
        return logits.argmax(-1).tolist()
    out: list[int | Exception] = []
    for row, p, gen in zip(logits, params, generators):
        try:
            out.append(int(row.argmax()) if p.greedy else _sample_row(row, p, gen))
        except Exception as e:  # noqa: BLE001 - reported to that request
            out.append(e)
    return out


def _sample_row(row: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    row = row.float() / p.temperature
    if p.top_k > 0:
        kth = torch.topk(row, min(p.top_k, row.numel())).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = torch.softmax(row, -1)
    if p.top_p < 1:
        sorted_probs, idx = probs.sort(descending=True)
        # keep the smallest prefix whose mass reaches top_p, and always the most likely token
        # (a top_p that rounds to 0 in float32 would otherwise drop them all)
        drop = sorted_probs.cumsum(-1) - sorted_probs >= p.top_p
        drop[0] = False
        probs = probs.scatter(0, idx, sorted_probs.masked_fill(drop, 0))
    return int(torch.multinomial(probs, 1, generator=gen))
