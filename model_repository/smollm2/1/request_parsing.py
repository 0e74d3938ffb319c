"""Parsing and validation of one generate request: numpy arrays and JSON in, checked values out.

Pure (numpy and the standard library, no Triton), so every path is tested without a server
(tests/engine/test_request_fuzz.py); triton_request.py reads a request's tensors into a dict and
calls `parse_inputs`. Inputs and outputs follow Triton's vLLM backend, so its clients and tools work
unchanged. A bad request becomes a `RequestError` carrying the Triton error code's name, and never
reaches the engine. Every size is bounded before it is parsed (README "Limits"), and nothing a
request holds names a file, a model or an engine option: only sampling keys, `priority` and
`timeout` (and, where the test hook is on, `test_fault`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np

# (name, data_type, dims, optional) -- the vLLM backend's generate inputs and outputs, and `messages`: a chat
# (OpenAI's JSON list of {"role", "content"}) that the model's own chat template renders. One of the two is given.
INPUTS = [
    ("text_input", "TYPE_STRING", [1], True),
    ("messages", "TYPE_STRING", [1], True),
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
MAX_ID_CHARS = 256
MAX_MESSAGES = 1024
MAX_PRIORITY = 1 << 31  # |priority| below this
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


def _integer(key: str, value, why: str) -> int:
    """An int, or a string spelling one (vLLM-backend clients send strings); RequestError otherwise."""
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:  # not an integer ("²" passes isdigit), or one of more than 4,300 digits
            pass
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid(f"sampling parameter {key!r}={show(value)}: {why}")
    return value


def _priority(value) -> int:
    why = "must be an integer of magnitude below 2**31"
    value = _integer(PRIORITY_KEY, value, why)
    if not -MAX_PRIORITY < value < MAX_PRIORITY:
        raise invalid(f"sampling parameter 'priority'={show(value)}: {why}")
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
            raise invalid(f"sampling parameter {TIMEOUT_KEY!r}={show(us)}: {why}")
    set_us = [us for us in limits_us if us > 0]
    return min(set_us) / 1e6 if set_us else None


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


def _string_input(inputs: Mapping, name: str, max_bytes: int) -> bytes | None:
    value = _one(inputs, name, "string")
    if isinstance(value, str):
        try:
            value = value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise invalid(f"input '{name}' is not valid UTF-8: {e}") from None
    if value is not None and not isinstance(value, bytes):  # BYTES tensors arrive as bytes objects
        raise invalid(f"input '{name}' must be a string (BYTES), got {type(value).__name__}")
    if value is not None and len(value) > max_bytes:
        raise invalid(f"input '{name}' has {len(value)} bytes; this model takes at most {max_bytes}")
    return value


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


def _content(value, where: str) -> str:
    """A message's content: a string, or OpenAI's list of parts of which only text parts are taken here."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)
    raise invalid(f"{where}: 'content' must be a string or a list of {{\"type\": \"text\", \"text\": ...}} parts")


def _messages(text: bytes) -> list[dict]:
    """The `messages` input: a JSON array of chat messages -> [{"role", "content"[, "name"]}] of strings."""
    try:
        value = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise invalid(f"input 'messages' is not valid JSON: {e}") from None
    except RecursionError:
        raise invalid("input 'messages' is nested too deeply") from None
    if not isinstance(value, list) or not value:
        raise invalid("input 'messages' must be a non-empty JSON array of {\"role\": ..., \"content\": ...} objects")
    if len(value) > MAX_MESSAGES:
        raise invalid(f"input 'messages' has {len(value)} messages; at most {MAX_MESSAGES}")
    messages = []
    for i, m in enumerate(value):
        where = f"input 'messages'[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]:
            raise invalid(f"{where} must be an object with a string 'role'")
        message = {"role": m["role"], "content": _content(m.get("content"), where)}
        if isinstance(m.get("name"), str):
            message["name"] = m["name"]
        messages.append(message)
    return messages


def _id_label(value) -> str | None:
    """The generate extension's request "id", as a label for the engine's request id (at most MAX_ID_CHARS, as
    Triton's own request id)."""
    if value is None:
        return None
    label = value if isinstance(value, str) else show(value)
    if len(label) > MAX_ID_CHARS:
        raise invalid(f"the request id has {len(label)} characters; at most {MAX_ID_CHARS}")
    return label


@dataclass(frozen=True)
class ParsedInputs:
    """What a generate request asks for, checked."""

    prompt: str | list  # text, or chat messages (the engine renders them with the model's chat template)
    params: object  # backend.sampling.SamplingParams
    priority: int
    stream: bool
    prepend_input: bool  # non-streamed text repeats the prompt
    additional: dict  # ADDITIONAL_OUTPUTS -> bool
    generate_id: str | None  # the generate extension's "id", when no Triton request id
    timeout_s: float | None = None  # the engine ends the request this long after it arrived
    fault: str | None = None  # the engine's fault-injection test hook


def parse_inputs(inputs: Mapping[str, np.ndarray], parameters: str, sampling_cls, limits=None,
                 triton_timeout_us: int = 0, allow_faults: bool = False) -> ParsedInputs:
    """A request's input tensors (name -> numpy array, as `as_numpy()` gives them) and its parameters
    (Triton's JSON text) -> ParsedInputs; RequestError (INVALID_ARG) naming the first problem.

    `limits`: the engine's `RequestLimits`, so a request is validated once, here. `triton_timeout_us`:
    Triton's request timeout. `allow_faults`: accept the `test_fault` key (the model's $ALRKVD_TEST_FAULTS)."""
    max_bytes = limits.max_prompt_bytes if limits else MAX_PROMPT_BYTES
    text = _string_input(inputs, "text_input", max_bytes)
    chat = _string_input(inputs, "messages", max_bytes)
    if (text is None) == (chat is None):
        raise invalid("give one of the inputs 'text_input' (a prompt) and 'messages' (a chat)")
    if chat is not None:
        prompt = _messages(chat)
    else:
        try:
            prompt = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise invalid(f"input 'text_input' is not valid UTF-8: {e}") from None
        if not prompt:
            raise invalid("input 'text_input' is empty")

    stream = bool(_bool_input(inputs, "stream"))
    exclude = _bool_input(inputs, "exclude_input_in_output")
    # The vLLM backend's rule: non-streamed output repeats the prompt unless excluded;
    # streamed output never does. A chat's answer never repeats the rendered chat.
    prepend_input = (not exclude) if exclude is not None else not (stream or chat is not None)
    if (stream or chat is not None) and prepend_input:
        raise invalid("when streaming or with 'messages', 'exclude_input_in_output' = false is not allowed")

    if len(parameters or "") > MAX_PARAMETERS_BYTES:
        raise invalid(f"the request's parameters take {len(parameters)} characters of JSON; "
                      f"at most {MAX_PARAMETERS_BYTES}")
    raw = _json_object(parameters or "{}", "the request parameters")
    # The generate extension's optional request "id" reaches the model as a parameter (Triton 2.51).
    generate_id = _id_label(raw.pop("id", None))
    sampling_json = _string_input(inputs, "sampling_parameters", MAX_PARAMETERS_BYTES)
    if sampling_json is not None:
        raw.update(_json_object(sampling_json, "input 'sampling_parameters'"))  # the input wins
    timeout_s = parse_timeout(triton_timeout_us, raw.pop(TIMEOUT_KEY, None))
    fault = raw.pop(TEST_FAULT_KEY, None) if allow_faults else None
    params, priority = parse_sampling(raw, sampling_cls, limits)
    return ParsedInputs(prompt=prompt, params=params, priority=priority, stream=stream,
                        prepend_input=prepend_input,
                        additional={k: bool(_bool_input(inputs, k)) for k in ADDITIONAL_OUTPUTS},
                        generate_id=generate_id, timeout_s=timeout_s,
                        fault=str(fault) if fault is not None else None)
