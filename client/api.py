"""Protocol-independent request building, stream framing and latency bookkeeping."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Iterator

DEFAULT_MODEL = "smollm2_moe"  # the deployment's default: SmolLM2 split into experts (README "Models")
DEFAULT_URLS = {"grpc": "127.0.0.1:8001", "http": "127.0.0.1:8000"}


class ServerError(RuntimeError):
    """The server refused or failed a request.

    `status` is the HTTP status (400, 503, ...) for HTTP and None for gRPC streams, which carry
    only a message; `message` is the server's text (it names the bad key or value).
    """

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message if status is None else f"HTTP {status}: {message}")
        self.message = message
        self.status = status


@dataclass
class Chunk:
    """One streamed response: the new text, plus the extra outputs when the server sent them."""

    text: str
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "timeout" on the last chunk
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None  # tokens in this chunk
    final: bool = False
    t: float = field(default_factory=time.perf_counter)


@dataclass
class Completion:
    """A whole streamed completion and its client-side latencies."""

    text: str
    pieces: list[str]
    finish_reason: str | None
    num_input_tokens: int | None
    num_output_tokens: int | None
    ttft_s: float  # request sent -> first text
    itl_s: list[float]  # gaps between successive text chunks
    e2e_s: float

    @property
    def mean_itl_s(self) -> float | None:
        return sum(self.itl_s) / len(self.itl_s) if self.itl_s else None

    @property
    def time_per_output_token_s(self) -> float | None:
        """(e2e - ttft) / (tokens - 1): per token even when a chunk holds several tokens."""
        n = self.num_output_tokens
        return (self.e2e_s - self.ttft_s) / (n - 1) if n and n > 1 else None


def request_fields(prompt: str, sampling: dict, streaming: bool) -> dict:
    """The vLLM-backend-compatible inputs of one request, as Python values."""
    return {
        "text_input": prompt,
        "stream": streaming,
        "sampling_parameters": json.dumps(sampling),
        "exclude_input_in_output": True,
        "return_finish_reason": True,
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
    }


def stream(prompt: str, url: str | None = None, model: str = DEFAULT_MODEL, protocol: str = "grpc",
           request_id: str = "", timeout_s: float = 600.0, deadline_s: float | None = None,
           **sampling) -> Iterator[Chunk]:
    """Stream one completion; `sampling` holds SamplingParams keys (max_tokens, temperature...).

    `timeout_s`: how long this client waits for each response. `deadline_s`: how long the server may
    take over the request, sent as Triton's request timeout (microseconds); past it the server ends
    the stream with finish_reason "timeout"."""
    if protocol == "grpc":
        from client.grpc_stream import stream_grpc as impl
    elif protocol == "http":
        from client.http_stream import stream_http as impl
    else:
        raise ValueError(f"protocol must be 'grpc' or 'http', not {protocol!r}")
    timeout_us = None if deadline_s is None else max(1, round(deadline_s * 1e6))
    return impl(prompt, url or DEFAULT_URLS[protocol], model, sampling, request_id, timeout_s, timeout_us)


def complete(prompt: str, url: str | None = None, model: str = DEFAULT_MODEL, protocol: str = "grpc",
             on_text=None, **kwargs) -> Completion:
    """Run `stream` to the end; `on_text(str)` sees each piece as it arrives."""
    start = time.perf_counter()
    pieces, times = [], []
    last = None
    num_out = None
    num_in = None
    for chunk in stream(prompt, url=url, model=model, protocol=protocol, **kwargs):
        if chunk.text:
            pieces.append(chunk.text)
            times.append(chunk.t)
            if on_text is not None:
                on_text(chunk.text)
        if chunk.num_output_tokens is not None:
            num_out = (num_out or 0) + chunk.num_output_tokens
        num_in = chunk.num_input_tokens if chunk.num_input_tokens is not None else num_in
        last = chunk
    end = time.perf_counter()
    return Completion(
        text="".join(pieces), pieces=pieces,
        finish_reason=last.finish_reason if last else None,
        num_input_tokens=num_in, num_output_tokens=num_out,
        ttft_s=(times[0] - start) if times else end - start,
        itl_s=[b - a for a, b in zip(times, times[1:])],
        e2e_s=end - start,
    )
