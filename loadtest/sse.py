"""Incremental Server-Sent Events parser for Triton's `generate_stream` endpoint.

Bytes are fed as they come off the socket; every complete event is returned with the arrival time
of the chunk that completed it, so a load test can time each streamed piece. Follows the WHATWG
event-stream rules that matter here: lines end in LF, CRLF or CR; a blank line dispatches the
event; `data:` lines are joined with "\n"; one space after the colon is dropped; lines starting
with ":" are comments; an unfinished event at end of stream is discarded.

Triton sends `data: {json}` events; an inference error after the stream started arrives as
`data: {"error": "..."}` under HTTP 200, so every event must be checked (`TritonEvent.error`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_EOL = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True)
class SSEEvent:
    data: str
    event: str = "message"
    id: str | None = None
    t: float = 0.0  # arrival time of the chunk that completed this event


@dataclass
class SSEParser:
    """Feed raw bytes with `feed(chunk, t)`; get back the events completed by that chunk."""

    _buf: bytes = b""
    _data: list[str] = field(default_factory=list)
    _event: str | None = None
    _id: str | None = None
    _pending_cr: bool = False

    def feed(self, chunk: bytes, t: float = 0.0) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the LF of a CRLF split across two chunks
        self._pending_cr = False
        buf = self._buf + chunk
        start = 0
        for m in _EOL.finditer(buf):
            if m.group() == b"\r" and m.end() == len(buf):
                self._pending_cr = True  # maybe the first half of a CRLF
            ev = self._line(buf[start:m.start()].decode("utf-8"), t)
            start = m.end()
            if ev is not None:
                events.append(ev)
        self._buf = buf[start:]
        return events

    @property
    def partial(self) -> bool:
        """True when the stream stopped inside an event (bytes or data lines not yet dispatched)."""
        return bool(self._buf.strip() or self._data)

    def _line(self, line: str, t: float) -> SSEEvent | None:
        if line == "":
            if not self._data:
                self._event = None
                return None
            ev = SSEEvent("\n".join(self._data), self._event or "message", self._id, t)
            self._data, self._event = [], None
            return ev
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        return None  # "retry" and unknown fields are ignored


@dataclass(frozen=True)
class TritonEvent:
    """One decoded `generate_stream` event."""

    t: float
    text: str
    num_output_tokens: int | None  # tokens in this piece, when the model returns the count
    num_input_tokens: int | None
    finish_reason: str | None
    error: str | None
    raw: dict


def _scalar(v):
    # Triton's generate JSON gives one-element tensors as scalars, longer ones as lists.
    if isinstance(v, list):
        return v[0] if len(v) == 1 else v
    return v


def decode_triton_event(ev: SSEEvent) -> TritonEvent:
    """Decode one event's JSON; raises ValueError on a payload that is not a JSON object."""
    try:
        obj = json.loads(ev.data)
    except json.JSONDecodeError as e:
        raise ValueError(f"SSE event is not JSON: {ev.data[:200]!r}") from e
    if not isinstance(obj, dict):
        raise ValueError(f"SSE event is not a JSON object: {ev.data[:200]!r}")
    error = obj.get("error")
    text = _scalar(obj.get("text_output", ""))
    nout = _scalar(obj.get("num_output_tokens"))
    nin = _scalar(obj.get("num_input_tokens"))
    finish = _scalar(obj.get("finish_reason"))
    return TritonEvent(
        t=ev.t,
        text=text if isinstance(text, str) else "",
        num_output_tokens=int(nout) if nout is not None else None,
        num_input_tokens=int(nin) if nin is not None else None,
        finish_reason=str(finish) if finish is not None else None,
        error=str(error) if error is not None else None,
        raw=obj,
    )
