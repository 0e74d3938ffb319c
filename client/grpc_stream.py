"""gRPC streaming through `tritonclient.grpc` (ModelStreamInfer, the bidirectional stream)."""

from __future__ import annotations

import queue
from typing import Iterator

import numpy as np
import tritonclient.grpc as grpcclient

from client.api import Chunk, ServerError, request_fields


def _inputs(fields: dict) -> list:
    inputs = []
    for name, value in fields.items():
        if isinstance(value, bool):
            t = grpcclient.InferInput(name, [1], "BOOL")
            t.set_data_from_numpy(np.array([value], dtype=bool))
        else:
            t = grpcclient.InferInput(name, [1], "BYTES")
            t.set_data_from_numpy(np.array([value.encode("utf-8")], dtype=np.object_))
        inputs.append(t)
    return inputs


def _scalar(result, name, cast):
    arr = result.as_numpy(name)
    if arr is None or arr.size == 0:
        return None
    v = arr.reshape(-1)[0]
    return cast(v.decode("utf-8") if isinstance(v, bytes) else v)


def stream_grpc(prompt: str, url: str, model: str, sampling: dict, request_id: str = "",
                timeout_s: float = 600.0, timeout_us: int | None = None) -> Iterator[Chunk]:
    """`timeout_us`: Triton's request timeout (the server's deadline for the request)."""
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    done = False
    try:
        client.async_stream_infer(model, _inputs(request_fields(prompt, sampling, True)),
                                  request_id=request_id, enable_empty_final_response=True, timeout=timeout_us)
        while not done:
            try:
                result, error = responses.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"no response from {url} within {timeout_s:.0f} s") from None
            if error is not None:
                done = True
                raise ServerError(error.message() if hasattr(error, "message") else str(error))
            done = result.get_response().parameters["triton_final_response"].bool_param
            text = _scalar(result, "text_output", str) or ""
            reason = _scalar(result, "finish_reason", str)
            yield Chunk(
                text=text,
                finish_reason=None if reason in (None, "None") else reason,
                num_input_tokens=_scalar(result, "num_input_tokens", int),
                num_output_tokens=_scalar(result, "num_output_tokens", int),
                final=done,
            )
    finally:
        # Leaving early (break, exception, generator closed) cancels the request server-side.
        client.stop_stream(cancel_requests=not done)
        client.close()
