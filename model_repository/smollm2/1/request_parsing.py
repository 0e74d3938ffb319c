"""Parsing and validation of one generate request: numpy arrays and JSON in, checked values out.

Pure (numpy and the standard library, no Triton), so every path is tested without a server
(tests/engine/test_request_fuzz.py); triton_request.py reads a request's tensors into a dict and
calls `parse_inputs`. Inputs and outputs follow Triton's vLLM backend, so its clients and tools work
unchanged. A bad request becomes a `RequestError` carrying the Triton error code's name, and never
reaches the engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np

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
MAX_PROMPT_BYTES = 1 << 20
MAX_ID_CHARS = 256
SHOWN_CHARS = 80  # of a refused value, in its error message


class RequestError(Exception):
    """A request refused before it reached the engine (or at its door, e.g. a full queue).

    `code` names a `pb_utils.TritonError` code: "INVALID_ARG", "UNAVAILABLE", "INTERNAL".
    """

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def invalid(message: str) -> RequestError:
    return RequestError(message, "INVALID_ARG")


def unavailable(message: str) -> RequestError:
    return RequestError(message, "UNAVAILABLE")


def show(value) -> str:
    """repr of a refused value for an error message: bounded, and always printable."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4,300-digit conversion limit
        text = f"<int of {value.bit_length()} bits>" if isinstance(value, int) else f"<{type(value).__name__}>"
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} chars)"


# ----------------------------------------------------------------------------------------------
# Sampling parameters
# ----------------------------------------------------------------------------------------------


def _coerce(value, annotation: str):
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
    except ValueError:  # not a number, or an int of more than 4,300 digits
        pass
    return value


def _priority(value) -> int:
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            pass
    if not isinstance(value, int) or isinstance(value, bool) or not -(1 << 63) <= value < 1 << 63:
        raise invalid(f"sampling parameter 'priority'={show(value)}: must be a 64-bit integer")
    return value


def parse_sampling(raw: Mapping, sampling_cls, limits=None):
    """Dict from the request -> (SamplingParams, priority); RequestError on bad keys/values."""
    raw = {k: v for k, v in raw.items() if not (isinstance(k, str) and k.startswith(RESERVED_PARAMETER_PREFIX))}
    priority = _priority(raw.pop(PRIORITY_KEY, 0))
    annotations = {f.name: str(f.type) for f in fields(sampling_cls)}
    values = {k: _coerce(v, annotations[k]) if k in annotations else v for k, v in raw.items()}
    try:
        params = sampling_cls.from_dict(values, limits)
    except (ValueError, TypeError) as e:
        raise invalid(str(e)) from None
    return params, priority


# ----------------------------------------------------------------------------------------------
# One request's inputs
# ----------------------------------------------------------------------------------------------


def _one(inputs: Mapping, name: str, kind: str):
    arr = inputs.get(name)
    if arr is None:
        return None
    arr = np.asarray(arr)
    if arr.size != 1:
        raise invalid(f"input '{name}' must hold one {kind}, got shape {list(arr.shape)}")
    return arr.reshape(-1)[0]


def _bool_input(inputs: Mapping, name: str) -> bool | None:
    value = _one(inputs, name, "boolean")
    if value is not None and not isinstance(value, (bool, np.bool_)):
        raise invalid(f"input '{name}' must be BOOL, got {type(value).__name__}")
    return None if value is None else bool(value)


def _string_input(inputs: Mapping, name: str) -> bytes | None:
    value = _one(inputs, name, "string")
    if value is None or isinstance(value, bytes):  # BYTES tensors arrive as bytes objects
        return value
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise invalid(f"input '{name}' is not valid UTF-8: {e}") from None
    raise invalid(f"input '{name}' must be a string (BYTES), got {type(value).__name__}")


def _json_object(text, what: str) -> dict:
    """A JSON object from str/bytes; RequestError when it is not valid JSON or not an object."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        value = json.loads(text) if text.strip() else {}
    except (UnicodeDecodeError, ValueError) as e:  # ValueError: JSONDecodeError, ints past 4,300 digits
        raise invalid(f"{what} is not valid JSON: {e}") from None
    except RecursionError:
        raise invalid(f"{what} is nested too deeply") from None
    if not isinstance(value, dict):
        raise invalid(f"{what} must be a JSON object")
    return value


def _id_label(value) -> str | None:
    """The generate extension's request "id", as a label for the engine's request id."""
    if value is None:
        return None
    return (value if isinstance(value, str) else show(value))[:MAX_ID_CHARS]


@dataclass(frozen=True)
class ParsedInputs:
    """What a generate request asks for, checked."""

    prompt: str
    params: object  # backend.sampling.SamplingParams
    priority: int
    stream: bool
    prepend_input: bool  # non-streamed text repeats the prompt
    additional: dict  # ADDITIONAL_OUTPUTS -> bool
    generate_id: str | None  # the generate extension's "id", when no Triton request id


def parse_inputs(inputs: Mapping[str, np.ndarray], parameters: str, sampling_cls, limits=None) -> ParsedInputs:
    """A request's input tensors (name -> numpy array, as `as_numpy()` gives them) and its parameters
    (Triton's JSON text) -> ParsedInputs; RequestError (INVALID_ARG) naming the first problem.

    `limits`: the engine's `RequestLimits`, so a request is validated once, here."""
    text = _string_input(inputs, "text_input")
    if text is None:
        raise invalid("input 'text_input' is required")
    if len(text) > MAX_PROMPT_BYTES:
        raise invalid(f"input 'text_input' has {len(text)} bytes; at most {MAX_PROMPT_BYTES}")
    try:
        prompt = text.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid(f"input 'text_input' is not valid UTF-8: {e}") from None
    if not prompt:
        raise invalid("input 'text_input' is empty")

    stream = bool(_bool_input(inputs, "stream"))
    exclude = _bool_input(inputs, "exclude_input_in_output")
    # The vLLM backend's rule: non-streamed output repeats the prompt unless excluded;
    # streamed output never does.
    prepend_input = (not exclude) if exclude is not None else not stream
    if stream and prepend_input:
        raise invalid("when streaming, 'exclude_input_in_output' = false is not allowed")

    raw = _json_object(parameters or "{}", "the request parameters")
    # The generate extension's optional request "id" reaches the model as a parameter (Triton 2.51).
    generate_id = _id_label(raw.pop("id", None))
    sampling_json = _string_input(inputs, "sampling_parameters")
    if sampling_json is not None:
        raw.update(_json_object(sampling_json, "input 'sampling_parameters'"))  # the input wins
    params, priority = parse_sampling(raw, sampling_cls, limits)
    return ParsedInputs(prompt=prompt, params=params, priority=priority, stream=stream,
                        prepend_input=prepend_input,
                        additional={k: bool(_bool_input(inputs, k)) for k in ADDITIONAL_OUTPUTS},
                        generate_id=generate_id)
