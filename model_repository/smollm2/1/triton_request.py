"""A Triton request's tensors -> `request_parsing.parse_inputs`, and the responses to it.

The parsing itself is pure and lives in request_parsing.py; here are only the pieces that touch
`triton_python_backend_utils`: reading the input tensors, the error and the responses.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import triton_python_backend_utils as pb_utils

from request_parsing import (INPUTS, MAX_ID_CHARS, OUTPUTS, RequestError, invalid,  # noqa: F401 - model.py's
                             parse_inputs, unavailable)


def to_triton(error: RequestError) -> "pb_utils.TritonError":
    """The error a client sees. The message goes through pybind11 as UTF-8: a lone surrogate (from a JSON
    "\\udXXX" escape) would raise there, so it is escaped."""
    message = str(error).encode("utf-8", "backslashreplace").decode("utf-8")
    return pb_utils.TritonError(message, getattr(pb_utils.TritonError, error.code))


def _utf8(read, what: str) -> str:
    """`request.parameters()` or `request.request_id()`: pybind11 decodes Triton's bytes as UTF-8, and an
    HTTP client can send invalid UTF-8 in a JSON string (Triton's JSON parser passes it through)."""
    try:
        return read()
    except UnicodeDecodeError as e:
        raise invalid(f"{what} is not valid UTF-8: {e.reason} at byte {e.start}") from None


def input_arrays(request) -> dict:
    """The request's input tensors that this model declares, name -> numpy array."""
    arrays = {}
    for name, *_ in INPUTS:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is not None:
            arrays[name] = tensor.as_numpy()
    return arrays


@dataclass
class GenerateRequest:
    """A parsed, validated request and what is needed to answer it."""

    sender: object  # pb_utils.InferenceResponseSender
    request_id: str  # unique engine id (Triton ids are client-chosen and may repeat)
    prompt: str
    params: object  # backend.engine.SamplingParams
    priority: int
    stream: bool
    prepend_input: bool
    additional: dict
    deadline: float | None = None  # time.monotonic() when the engine ends it with finish_reason "timeout"
    fault: str | None = None  # the engine's fault-injection test hook
    arrival: float = field(default_factory=time.perf_counter)
    # response state
    sent_text_len: int = 0
    sent_tokens: int = 0
    seen_tokens: int = 0
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_prompt_tokens: int = 0
    final_sent: bool = False
    cancelled: bool = False

    @classmethod
    def parse(cls, request, sampling_cls, limits=None, allow_faults: bool = False) -> "GenerateRequest":
        """Read the request's tensors and parameters, check them (request_parsing.parse_inputs);
        RequestError (INVALID_ARG) naming the problem. `limits`: the engine's `RequestLimits`;
        `allow_faults`: accept the `test_fault` key (the model's $ALRKVD_TEST_FAULTS)."""
        p = parse_inputs(input_arrays(request), _utf8(request.parameters, "the request parameters"),
                         sampling_cls, limits, request.timeout(), allow_faults)
        triton_id = _utf8(request.request_id, "the request id") or p.generate_id or "req"
        if len(triton_id) > MAX_ID_CHARS:
            raise invalid(f"the request id has {len(triton_id)} characters; at most {MAX_ID_CHARS}")
        return cls(
            sender=request.get_response_sender(),
            request_id=f"{triton_id}-{uuid.uuid4().hex[:12]}",
            prompt=p.prompt, params=p.params, priority=p.priority, stream=p.stream,
            prepend_input=p.prepend_input, additional=p.additional,
            deadline=time.monotonic() + p.timeout_s if p.timeout_s is not None else None, fault=p.fault,
        )

    # ---- responses -----------------------------------------------------------------------
    def create_response(self, out) -> "pb_utils.InferenceResponse":
        """Response for engine output `out`: the new text when streaming, else all of it."""
        if self.stream:
            text = out.text[self.sent_text_len:]
        else:
            text = (self.prompt if self.prepend_input else "") + out.text
        self.sent_text_len = len(out.text)
        tensors = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
        if self.additional["return_finish_reason"]:
            tensors.append(pb_utils.Tensor(
                "finish_reason", np.array([str(out.finish_reason).encode("utf-8")], dtype=np.object_)))
        if self.additional["return_num_input_tokens"]:
            tensors.append(pb_utils.Tensor(
                "num_input_tokens", np.array([out.num_prompt_tokens], dtype=np.uint32)))
        if self.additional["return_num_output_tokens"]:
            tensors.append(pb_utils.Tensor(
                "num_output_tokens", np.array([out.num_output_tokens - self.sent_tokens], dtype=np.uint32)))
        self.sent_tokens = out.num_output_tokens
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def wants(self, out) -> bool:
        """Whether `out` deserves a response: streaming sends every piece of new text."""
        if out.finished:
            return True
        return self.stream and len(out.text) > self.sent_text_len
