"""Sampling parameters (validated at the door) and the per-step sampler."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import torch

from backend.copies import QueuedRead, queued_tensor
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
    """One token per row of logits [B, V] (`draw`), read on the host: one wait on the GPU for the whole batch (a row at
    a time, a step of 32 sampled rows waited 32 times). Should the batch raise, each row samples alone, so that one
    request's failure is that request's alone."""
    try:
        return read_tokens(draw(logits, params, generators))
    except Exception:  # noqa: BLE001 - then row by row, each row's error its own
        pass
    out: list[int | Exception] = []
    for row, p, gen in zip(logits, params, generators):
        try:
            out.append(read_tokens(draw(row[None], [p], [gen]))[0])
        except Exception as e:  # noqa: BLE001 - reported to that request
            out.append(e)
    return out


def read_tokens(tokens: torch.Tensor | QueuedRead) -> list[int | Exception]:
    """`draw`'s tokens on the host (the wait on the GPU), an error where a row drew none."""
    return [t if t >= 0 else ValueError("no token has a finite probability") for t in tokens.tolist()]


def draw(logits: torch.Tensor, params: list[SamplingParams],
         generators: list[torch.Generator | None]) -> torch.Tensor:
    """Token ids [B] on the logits' device, queued without waiting for the GPU; -1 where a row has no token of
    finite probability. Greedy rows take the argmax. The others: temperature, then top-k (ties at the k-th value
    kept), then top-p (the smallest prefix reaching it, always the most likely token), then an exponential race: the
    argmax of p / E, E ~ Exp(1), picks token i with probability p_i, without the multinomial's host sync. A seeded
    row draws its E from its own generator, so its tokens do not depend on the other rows of the batch."""
    if all(p.greedy for p in params):
        return logits.argmax(-1)
    B, V = logits.shape
    ks = [min(p.top_k, V) if p.top_k > 0 else V for p in params]
    rows = [(1.0 if p.greedy else p.temperature, k, p.top_p if p.top_p < 1 else 2.0, p.greedy)
            for p, k in zip(params, ks)]
    # one copy, queued (a tensor made on the device from a list would wait for the step's forward to finish)
    temperature, top_k, top_p, greedy = queued_tensor(torch.tensor(rows), logits.device).unbind(1)
    x = logits.float() / temperature[:, None]
    if min(ks) < V:
        top = torch.topk(x, max(k for k in ks if k < V), dim=-1).values
        kth = top.gather(1, (top_k.clamp(max=top.shape[1]).long() - 1)[:, None])
        x = x.masked_fill((x < kth) & (top_k < V)[:, None], float("-inf"))
    probs = torch.softmax(x, -1)
    if any(p.top_p < 1 for p in params):
        sorted_probs, idx = probs.sort(-1, descending=True)
        drop = sorted_probs.cumsum(-1) - sorted_probs >= top_p[:, None]  # a top_p of 0 in float32: all but the top
        drop[:, 0] = False
        probs = probs.scatter(1, idx, sorted_probs.masked_fill(drop, 0))
    race = torch.empty_like(probs).exponential_()
    for i, gen in enumerate(generators):
        if gen is not None and not params[i].greedy:
            race[i].exponential_(generator=gen)
    race.clamp_(min=torch.finfo(race.dtype).tiny)  # a draw of exactly 0 would make 0 / 0 = NaN, which argmax takes
    tokens = (probs / race).argmax(-1)
    if any(p.greedy for p in params):
        tokens = torch.where(greedy.bool(), logits.argmax(-1), tokens)
    # a row without a token of finite probability (NaN probabilities) draws a token of probability NaN or 0
    drawn = probs.gather(1, tokens[:, None])[:, 0]
    return tokens.masked_fill(~((drawn > 0) | greedy.bool()), -1)
