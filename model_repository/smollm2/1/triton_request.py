"""Parsing and validation of one generate request, and building its responses.

Inputs and outputs follow Triton's vLLM backend, so its clients and tools work unchanged.
Everything here runs before the engine sees the request: a bad request becomes a
`RequestError` carrying the Triton error code, and never reaches the engine. Every size is
bounded before it is parsed (README "Limits"), and nothing a request holds names a file, a model
or an engine option: only sampling keys, `priority` and `timeout` (and, where the test hook is
on, `test_fault`).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field, fields

import numpy as np
import triton_python_backend_utils as pb_utils

# (name, data_type, dims, optional) -- the vLLM backend's generate inputs and outputs.
INPUTS = [
    ("text_input", "TYPE_STRING", [1], False),
    ("stream", "TYPE_BOOL", [1], True),
    ("sampling_parameters", "TYPE_STRING", [1], True),
    ("exclude_input_in_output", "TYPE_BOOL", [1], True),
    ("return_finish_reason", "TYPE_BOOL", [1], True),
    ("return_num_input_tokens", "TYPE_BOOL", [1], True),
    ("return_num_output_tokens", "TYPE_BOOL", [1], True),
]
OUTPUTS = [
    ("text_output", "TYPE_STRING", [-1]),
    ("finish_reason", "TYPE_STRING", [-1]),
    ("num_input_tokens", "TYPE_UINT32", [1]),
    ("num_output_tokens", "TYPE_UINT32", [-1]),
]
ADDITIONAL_OUTPUTS = ("return_finish_reason", "return_num_input_tokens", "return_num_output_tokens")
# Request keys that are not sampling parameters: set by Triton's frontends, or taken here.
RESERVED_PARAMETER_PREFIX = "triton_"
PRIORITY_KEY = "priority"
# Triton's request timeout, in microseconds (its unit): tritonclient's `timeout=`, the gRPC and /infer
# `timeout` parameter (Triton hands it to the model as `request.timeout()`), or a "timeout" key of the
# generate endpoints (which pass it on as a plain parameter). Triton itself enforces it only in a
# batcher's queue, which this model has none of; the engine ends the request when it passes.
TIMEOUT_KEY = "timeout"
MAX_TIMEOUT_S = 3600
TEST_FAULT_KEY = "test_fault"  # the engine's fault-injection hook, accepted only with $ALRKVD_TEST_FAULTS=1
MAX_PROMPT_BYTES = 1 << 20  # without the engine's limits (backend.sampling.MAX_PROMPT_BYTES)
MAX_PARAMETERS_BYTES = 64 << 10  # the request's parameters, and the sampling_parameters input: JSON each
MAX_REQUEST_ID_CHARS = 256
MAX_PRIORITY = 1 << 31  # |priority| below this


class RequestError(Exception):
    """A request refused before it reached the engine (or at its door, e.g. a full queue)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code

    def to_triton(self) -> "pb_utils.TritonError":
        return pb_utils.TritonError(str(self), self.code)


def invalid(message: str) -> RequestError:
    return RequestError(message, pb_utils.TritonError.INVALID_ARG)


def unavailable(message: str) -> RequestError:
    return RequestError(message, pb_utils.TritonError.UNAVAILABLE)


# ----------------------------------------------------------------------------------------------
# Sampling parameters
# ----------------------------------------------------------------------------------------------


def _coerce(key: str, value, annotation: str):
    """vLLM-backend clients send numbers as strings ({"temperature": "0.1"}); accept those.

    Only a string that spells a value of the field's type is converted; anything else is left
    for `SamplingParams.from_dict`, which rejects it with a message naming key and value.
    """
    if not isinstance(value, str):
        return value
    ann = annotation.replace(" ", "")
    try:
        if ann in ("int", "int|None"):
            return int(value)
        if ann in ("float", "float|None"):
            return float(value)
        if ann in ("bool", "bool|None") and value.lower() in ("true", "false"):
            return value.lower() == "true"
    except ValueError:
        pass
    return value


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _integer(key: str, value, why: str) -> int:
    """An int, or a string spelling one (vLLM-backend clients send strings); RequestError otherwise."""
    if isinstance(value, str) and value.lstrip("-").isdigit() and len(value) < 24:
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid(f"sampling parameter {key!r}={_short(value)}: {why}")
    return value


def parse_timeout(triton_timeout_us: int, raw_value=None) -> float | None:
    """Seconds a request may take, from Triton's request timeout and/or a "timeout" key (microseconds
    both; the shorter wins); None when neither is set (0 is Triton's "none")."""
    why = f"must be an integer number of microseconds in [0, {MAX_TIMEOUT_S * 10**6}] ({MAX_TIMEOUT_S} s)"
    limits_us = [triton_timeout_us or 0]
    if raw_value is not None:
        limits_us.append(_integer(TIMEOUT_KEY, raw_value, why))
    for us in limits_us:
        if not 0 <= us <= MAX_TIMEOUT_S * 10**6:
            raise invalid(f"sampling parameter {TIMEOUT_KEY!r}={us}: {why}")
    set_us = [us for us in limits_us if us > 0]
    return min(set_us) / 1e6 if set_us else None


def parse_sampling(raw: dict, sampling_cls, limits=None):
    """Dict from the request -> (SamplingParams, priority); RequestError on bad keys/values."""
    raw = {k: v for k, v in raw.items() if not k.startswith(RESERVED_PARAMETER_PREFIX)}
    priority = _integer(PRIORITY_KEY, raw.pop(PRIORITY_KEY, 0), "must be an integer of magnitude below 2**31")
    if not -MAX_PRIORITY < priority < MAX_PRIORITY:
        raise invalid(f"sampling parameter 'priority'={priority}: must be an integer of magnitude below 2**31")
    annotations = {f.name: str(f.type) for f in fields(sampling_cls)}
    values = {k: _coerce(k, v, annotations[k]) if k in annotations else v for k, v in raw.items()}
    try:
        params = sampling_cls.from_dict(values, limits)
    except (ValueError, TypeError) as e:
        raise invalid(str(e)) from None
    return params, priority


# ----------------------------------------------------------------------------------------------
# One request
# ----------------------------------------------------------------------------------------------


def _input(request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _bool_input(request, name: str) -> bool | None:
    arr = _input(request, name)
    if arr is None:
        return None
    if arr.size != 1:
        raise invalid(f"input '{name}' must hold one boolean, got shape {list(arr.shape)}")
    return bool(arr.reshape(-1)[0])


def _string_input(request, name: str, max_bytes: int) -> bytes | None:
    arr = _input(request, name)
    if arr is None:
        return None
    if arr.size != 1:
        raise invalid(f"input '{name}' must hold one string, got shape {list(arr.shape)}")
    value = arr.reshape(-1)[0]
    value = value if isinstance(value, bytes) else str(value).encode("utf-8")
    if len(value) > max_bytes:
        raise invalid(f"input '{name}' has {len(value)} bytes; this model takes at most {max_bytes}")
    return value


def _request_parameters(request) -> dict:
    text = request.parameters() or "{}"
    if len(text) > MAX_PARAMETERS_BYTES:
        raise invalid(f"the request's parameters take {len(text)} characters of JSON; at most {MAX_PARAMETERS_BYTES}")
    return dict(json.loads(text))


def _request_id(request, generate_id) -> str:
    triton_id = request.request_id() or (str(generate_id) if generate_id is not None else "req")
    if len(triton_id) > MAX_REQUEST_ID_CHARS:
        raise invalid(f"the request id has {len(triton_id)} characters; at most {MAX_REQUEST_ID_CHARS}")
    return triton_id


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
        """`limits`: the engine's `RequestLimits`, so a request is validated once, here.
        `allow_faults`: accept the `test_fault` key (the model's $ALRKVD_TEST_FAULTS)."""
        # Read and check every input; raises RequestError (INVALID_ARG) naming the problem.
        text = _string_input(request, "text_input", limits.max_prompt_bytes if limits else MAX_PROMPT_BYTES)
        if text is None:
            raise invalid("input 'text_input' is required")
        try:
            prompt = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise invalid(f"input 'text_input' is not valid UTF-8: {e}") from None
        if not prompt:
            raise invalid("input 'text_input' is empty")

        stream = bool(_bool_input(request, "stream"))
        exclude = _bool_input(request, "exclude_input_in_output")
        # The vLLM backend's rule: non-streamed output repeats the prompt unless excluded;
        # streamed output never does.
        prepend_input = (not exclude) if exclude is not None else not stream
        if stream and prepend_input:
            raise invalid("when streaming, 'exclude_input_in_output' = false is not allowed")

        raw = _request_parameters(request)
        # The generate extension's optional request "id" reaches the model as a parameter (Triton 2.51).
        generate_id = raw.pop("id", None)
        sampling_json = _string_input(request, "sampling_parameters", MAX_PARAMETERS_BYTES)
        if sampling_json is not None:
            try:
                from_input = json.loads(sampling_json.decode("utf-8")) if sampling_json.strip() else {}
            except (UnicodeDecodeError, ValueError) as e:
                raise invalid(f"input 'sampling_parameters' is not valid JSON: {e}") from None
            if not isinstance(from_input, dict):
                raise invalid("input 'sampling_parameters' must be a JSON object")
            raw.update(from_input)  # the input tensor wins over request parameters
        timeout_s = parse_timeout(request.timeout(), raw.pop(TIMEOUT_KEY, None))
        fault = raw.pop(TEST_FAULT_KEY, None) if allow_faults else None
        params, priority = parse_sampling(raw, sampling_cls, limits)
        triton_id = _request_id(request, generate_id)
        return cls(
            sender=request.get_response_sender(),
            request_id=f"{triton_id}-{uuid.uuid4().hex[:12]}",
            prompt=prompt, params=params, priority=priority, stream=stream,
            prepend_input=prepend_input,
            additional={k: bool(_bool_input(request, k)) for k in ADDITIONAL_OUTPUTS},
            deadline=time.monotonic() + timeout_s if timeout_s is not None else None,
            fault=str(fault) if fault is not None else None,
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
