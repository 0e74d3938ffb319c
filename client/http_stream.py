"""HTTP streaming through Triton's generate extension: `POST .../generate_stream`, server-sent events."""

from __future__ import annotations

import json
from typing import Iterator

import requests

from client.api import Chunk, ServerError, request_fields


def _int(v):
    if isinstance(v, list):
        v = v[0] if v else None
    return None if v is None else int(v)


def _str(v):
    if isinstance(v, list):
        v = v[0] if v else None
    return None if v in (None, "None") else str(v)


def _error_text(body: str) -> str:
    body = body.strip()
    if body.startswith("data:"):
        body = body[5:].strip()
    try:
        return json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return body


def stream_http(prompt: str, url: str, model: str, sampling: dict, request_id: str = "",
                timeout_s: float = 600.0, timeout_us: int | None = None) -> Iterator[Chunk]:
    """`timeout_us`: the request's deadline on the server, in Triton's unit (a "timeout" parameter)."""
    body = request_fields(prompt, sampling, True)
    if request_id:
        body["id"] = request_id
    if timeout_us is not None:
        body["timeout"] = timeout_us
    base = url if url.startswith("http") else f"http://{url}"
    # Connection: close -- a finished stream leaves no idle keep-alive connection behind, which
    # would hold up a graceful server stop.
    resp = requests.post(f"{base}/v2/models/{model}/generate_stream", json=body, stream=True,
                         timeout=timeout_s, headers={"Connection": "close"})
    try:
        if resp.status_code != 200:
            raise ServerError(_error_text(resp.text), resp.status_code)
        pending = None
        for line in resp.iter_lines(decode_unicode=False):
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:].decode("utf-8"))
            if "error" in event:
                raise ServerError(event["error"], resp.status_code)
            if pending is not None:
                yield pending
            pending = Chunk(
                text=event.get("text_output") or "",
                finish_reason=_str(event.get("finish_reason")),
                num_input_tokens=_int(event.get("num_input_tokens")),
                num_output_tokens=_int(event.get("num_output_tokens")),
            )
        if pending is not None:  # the stream closes after the final response
            pending.final = True
            yield pending
    finally:
        resp.close()
