"""Fuzz the running server over HTTP and gRPC: malformed and random requests, every answer classified.

    python -m loadtest.fuzz --start-server --cases 3000 --out reports/fuzz.json     # `make fuzz`
    python -m loadtest.fuzz --http-url 127.0.0.1:8000 --grpc-url 127.0.0.1:8001 --cases 300
    python -m loadtest.fuzz --http-url ... --grpc-url ... --seed 7 --only 123 -v    # replay one case

A black-box client: the wire protocol only (`requests` for HTTP; `grpc` with tritonclient's generated
stubs, so a request can be anything the protocol carries). Case i is drawn from its own seeded
generator (seed, i), so any case replays alone. Kinds:

    http_generate  JSON bodies mutated from a good one (wrong types, huge and negative ints, NaN, odd
                   Unicode, lone surrogates, deep nesting, long strings) to /generate and /generate_stream
    http_raw       bodies Triton's JSON parser must refuse, or JSON it takes that the model must refuse
                   (invalid UTF-8 in strings, deep nesting in sampling_parameters, ...)
    http_infer     KServe v2 /infer bodies: wrong names, datatypes, shapes, data; unknown models, versions
    grpc_stream    ModelStreamInfer: inputs mutated (names, datatypes, shapes, BYTES with invalid UTF-8
                   or a broken length prefix, typed contents), random parameters, versions, ids
    grpc_unary     ModelInfer, which a decoupled model refuses

Each answer is one outcome:

    ok                a complete answer: text_output (HTTP), or outputs and a final response (gRPC stream)
    invalid           refused with a message: HTTP 4xx, a gRPC stream's error message, a gRPC status such
                      as INVALID_ARGUMENT
    triton_front_end  an error with a message under a status other than 4xx, from Triton's own HTTP front
                      end: Triton 2.51 answers malformed JSON (or JSON it cannot convert to the inputs) with
                      500, /infer on a decoupled model with 501, and /generate on a streamed answer
                      ("stream": true) with 200 and {"error": ...}; every *model* error it answers with 400.
                      Known, not ours: reported apart
    server_error      a 5xx or gRPC INTERNAL/UNKNOWN without a message, or any answer carrying one of our
                      model's INTERNAL messages ("request parsing failed", "engine error") or a Python
                      backend failure
    bad_answer        a refusal without a message, a 200 without text_output, a stream without its end
    timeout           no complete answer within --timeout: a hang
    connection_error  the connection refused or dropped

After every --check-every cases a good request over HTTP and one over gRPC must succeed. The rule:
every case ok, invalid or triton_front_end, and every check passed; the exit status is 1 otherwise. The JSON
summary (--out) holds the counts by outcome and by kind, the checks, the most frequent messages of
each outcome and examples (case index, what was sent, what came back) of every outcome but ok/invalid.

Not generated: a gRPC request that declares an input without sending data for it (fewer raw contents
than inputs, or an empty one). Triton 2.51's gRPC front end answers it and serving goes on, but it keeps
a reference to the model, so the next server stop waits out --exit-timeout and the model's finalize
does not run (README, "Known Triton 2.51 fault"); such requests never reach model.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import struct
import sys
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import requests
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from loadtest.sse import SSEParser

OK, INVALID, TRITON_FRONT_END = "ok", "invalid", "triton_front_end"
SERVER_ERROR, BAD_ANSWER, TIMEOUT, CONNECTION_ERROR = "server_error", "bad_answer", "timeout", "connection_error"
OUTCOMES = (OK, INVALID, TRITON_FRONT_END, SERVER_ERROR, BAD_ANSWER, TIMEOUT, CONNECTION_ERROR)
ALLOWED = frozenset({OK, INVALID, TRITON_FRONT_END})
# Our model's INTERNAL errors (model.py) and the Python backend's own failures: never a clear refusal,
# whatever status carries them (Triton 2.51's HTTP generate maps every model error to 400).
INTERNAL_MARKERS = ("request parsing failed", "engine error", "Traceback (most recent call last)",
                    "Stub process", "is not healthy", "Failed to process the request")
# gRPC statuses that are a clear refusal of the request
GRPC_REFUSALS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                           grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.FAILED_PRECONDITION,
                           grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.ALREADY_EXISTS,
                           grpc.StatusCode.RESOURCE_EXHAUSTED})
KIND_WEIGHTS = {"http_generate": 34, "http_raw": 12, "http_infer": 8, "grpc_stream": 40, "grpc_unary": 6}
CLOSE = {"Connection": "close"}  # no idle keep-alive connections to hold up the server's stop
GOOD = {"text_input": "Hello", "max_tokens": 2, "temperature": 0, "ignore_eos": True}
SHOWN = 300  # characters of a request or an answer kept in the summary

# ----------------------------------------------------------------------------------------------
# Random values
# ----------------------------------------------------------------------------------------------

INPUT_NAMES = ["text_input", "stream", "sampling_parameters", "exclude_input_in_output",
               "return_finish_reason", "return_num_input_tokens", "return_num_output_tokens"]
SAMPLING_KEYS = ["max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
                 "ignore_eos", "priority"]
JUNK_KEYS = ["bogus", "", " ", "id", "Max_Tokens", "max_tokens ", "triton_x", "binary_data_output",
             "sequence_id", "timeout", "\u00e9", "\ud800", "\x00", "a" * 300, "__class__", "1"]
ODD_STRINGS = ["", " ", "a", "\x00", "\ud800", "\udfff", "x\udc80y", "\u202e", "\ufeff", "\u200b\u200b",
               "\U0001f600", "\u00b2", "\u0663", "1e400", "nan", "NaN", "inf", "-inf", "-0", "0x10", "1_0",
               " 7 ", "--5", "+3", "true", "False", "null", "{}", "[]", "9" * 5000, "\u00e9" * 2000,
               "<|im_start|>", "\n\n", "\\", '"', "0.5", "3", "-1"]
INTS = [0, 1, -1, 2, 3, 16, 50, 513, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -2**63 - 1,
        10**30, -10**30, 10**400]
FLOATS = [0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1e-300, 1e-5, 0.5, 0.9, 1.0, 1.5, 100.0,
          100.0000001, 1e308, math.nan, math.inf, -math.inf]
PROMPTS = ["Hello", "Once upon a time", " ", "\x00", "\u00e9t\u00e9 \U0001f600", "<|im_start|>user\nhi<|im_end|>",
           "\u202e\u200b\ufeff", "a" * 3000, "hello " * 1200, "hello " * 2500, "\n" * 100, "\U0001f469\u200d\U0001f469"]


def rand_value(rng: random.Random, depth: int = 0):
    """A random JSON-like value: wrong types, edge numbers, odd Unicode, nesting."""
    r = rng.random()
    if r < 0.25:
        return rng.choice(INTS)
    if r < 0.45:
        return rng.choice(FLOATS)
    if r < 0.72:
        return rng.choice(ODD_STRINGS)
    if r < 0.80:
        return rng.choice([True, False])
    if r < 0.84:
        return None
    if r < 0.92 and depth < 3:
        return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if depth < 3:
        return {rng.choice(SAMPLING_KEYS + JUNK_KEYS): rand_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return rng.choice(ODD_STRINGS)


def good_value(rng: random.Random, key: str):
    """A value the server takes for sampling key `key`, small enough to keep generations short."""
    return {"max_tokens": lambda: rng.randint(1, 4), "temperature": lambda: rng.choice([0, 0.7, 1e-6, "0.5"]),
            "top_p": lambda: rng.choice([1, 0.9, 5e-324]), "top_k": lambda: rng.choice([0, -1, 50]),
            "seed": lambda: rng.randint(0, 1000), "stop": lambda: rng.choice(["\n", ["."], []]),
            "stop_token_ids": lambda: rng.choice([[], [0], [2]]), "ignore_eos": lambda: rng.choice([True, "true"]),
            "priority": lambda: rng.choice([0, 5, "-3"])}[key]()


def deep(n: int, open_: str = "[", close: str = "]") -> str:
    return open_ * n + close * n


def to_json(rng: random.Random, value) -> bytes:
    """JSON text of `value`, sometimes with lone surrogates as raw (invalid UTF-8) bytes instead of escapes."""
    if rng.random() < 0.2:
        return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return json.dumps(value).encode()


# ----------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------


@dataclass
class Case:
    index: int
    kind: str
    # HTTP: path, body, headers (always POST); gRPC: the request message
    path: str = ""
    body: bytes = b""
    headers: dict = field(default_factory=dict)
    message: object = None
    stream: bool = False  # HTTP generate_stream

    def describe(self) -> str:
        if self.message is not None:
            text = str(self.message).replace("\n", " ")
        else:
            text = f"POST {self.path} {self.headers or ''} {self.body[:SHOWN]!r}"
        return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} chars)"


def gen_sampling_dict(rng: random.Random, clean: bool = False) -> dict:
    """Sampling keys and values; `clean`: only values the server takes."""
    d = {}
    for key in rng.sample(SAMPLING_KEYS, rng.randint(0, 4)):
        d[key] = good_value(rng, key) if clean or rng.random() < 0.5 else rand_value(rng)
    if not clean and rng.random() < 0.2:
        d[rng.choice(JUNK_KEYS)] = rand_value(rng)
    return d


def gen_sampling_text(rng: random.Random, clean: bool = False) -> str | bytes:
    """The sampling_parameters input: JSON of a sampling dict, or something that is not one."""
    r = rng.random()
    if clean or r < 0.6:
        return json.dumps(gen_sampling_dict(rng, clean))
    if r < 0.7:
        return deep(rng.choice([100, 5000, 100_000]))  # past Python's recursion limit
    if r < 0.8:
        return rng.choice(["{not json", "", "   ", "null", "[1, 2]", '"x"', "1e999", '{"max_tokens": NaN}',
                           '{"max_tokens": 1' + "0" * 5000 + "}", '{"a": 1,}', '{"max_tokens": 2} x'])
    if r < 0.9:
        return b'{"stop": "\xc3\x28"}' if rng.random() < 0.5 else json.dumps({"stop": "\ud800"}).encode()
    return json.dumps(rand_value(rng))


def gen_http_generate(rng: random.Random, model: str, index: int) -> Case:
    clean = rng.random() < 0.3  # only values the server takes: the engine gets odd but valid requests
    body: dict = {"text_input": rng.choice(PROMPTS[:5]) if rng.random() < 0.8 else rng.choice(PROMPTS)}
    if rng.random() < 0.85:
        body["max_tokens"] = rng.randint(1, 4)
    for key in rng.sample(SAMPLING_KEYS, rng.randint(0, 3)):
        if clean and key not in ("stop", "stop_token_ids"):  # Triton 2.51 takes int, bool, string parameters
            value = good_value(rng, key)
            body[key] = repr(value) if isinstance(value, float) else value
        elif not clean:
            body[key] = good_value(rng, key) if rng.random() < 0.5 else rand_value(rng)
    for name in rng.sample(INPUT_NAMES[1:], rng.randint(0, 3)):
        body[name] = rng.choice([True, False]) if clean or rng.random() < 0.6 else rand_value(rng)
    if "sampling_parameters" in body and (clean or rng.random() < 0.7):
        body["sampling_parameters"] = gen_sampling_text(rng, clean)
        if isinstance(body["sampling_parameters"], bytes):
            body["sampling_parameters"] = body["sampling_parameters"].decode("utf-8", "surrogateescape")
    for _ in range(0 if clean else rng.choice([0, 0, 0, 1, 2])):
        body[rng.choice(JUNK_KEYS)] = rand_value(rng)
    r = 1.0 if clean else rng.random()
    if r < 0.1:
        body["text_input"] = rand_value(rng)  # any type
    elif r < 0.15:
        del body["text_input"]
    elif r < 0.2:
        body["text_input"] = rng.choice(ODD_STRINGS)
    elif r < 0.22:
        body["text_input"] = "x" * rng.choice([(1 << 20) - 10, (1 << 20) + 1, 3 << 20])
    stream = rng.random() < 0.4
    if clean:
        body["stream"] = stream
        if stream or body.get("exclude_input_in_output") is False:
            body["exclude_input_in_output"] = stream or body["exclude_input_in_output"]
    text = to_json(rng, body)
    return Case(index, "http_generate", f"/v2/models/{model}/{'generate_stream' if stream else 'generate'}",
                text, {"Content-Type": "application/json"}, stream=stream)


RAW_BODIES = [
    b"", b"{", b"{not json", b"null", b"[]", b"1", b'"x"', b"\xff\xfe\x00", b'{"text_input": "Hi"} trailing',
    b'\xef\xbb\xbf{"text_input": "Hi"}', b'{"text_input": "\xc3\x28"}', b'{"text_input": "caf\xc3\xa9 \xff"}',
    b'{"text_input": "Hi", "max_tokens": 1e999}', b'{"text_input": NaN}', b'{"text_input": "Hi", "temperature": NaN}',
    b'{"text_input": "Hi", "temperature": Infinity}', b'{"text_input": "\\ud800"}', b'{"text_input": "\\udfff\\ud800"}',
    b'{"text_input": "Hi", "text_input": 5}', b'{"text_input": "Hi\x00"}', b'{"text_input": "Hi\x01\n"}',
    b'{"text_input": "Hi", "max_tokens": 9' + b"9" * 5000 + b"}", b'{"text_input": ["Hi", "Ho"]}',
    b'{"text_input": [["Hi"]]}', b'{"text_input": {"a": 1}}', b'{"text_input": null}', b'{"text_input": true}',
    b'{"text_input": "Hi", "stream": "yes"}', b'{"text_input": "Hi", "stream": [true, false]}',
    b'{"text_input": "Hi", "parameters": {"max_tokens": 1, "temperature": [1]}}',
    b'{"text_input": "Hi", "parameters": "max_tokens"}', b'{"text_input": "Hi", "id": 5}',
    b'{"text_input": "Hi", "id": {"a": 1}}', b'{"text_input": "Hi", "max_tokens": -0}',
]


def gen_http_raw(rng: random.Random, model: str, index: int) -> Case:
    r = rng.random()
    if r < 0.55:
        body = rng.choice(RAW_BODIES)
    elif r < 0.7:
        n = rng.choice([1000, 10_000, 100_000])
        body = b'{"text_input": "Hi", "x": ' + deep(n).encode() + b"}"
    elif r < 0.85:  # valid JSON whose sampling_parameters string nests past Python's recursion limit
        body = json.dumps({"text_input": "Hi", "max_tokens": 1,
                           "sampling_parameters": deep(rng.choice([2000, 50_000]), '{"a":', "}")
                           if rng.random() < 0.5 else deep(rng.choice([2000, 50_000]))}).encode()
    else:
        body = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200)))
    headers = rng.choice([{"Content-Type": "application/json"}, {}, {"Content-Type": "text/plain"},
                          {"Content-Type": "application/json; charset=latin-1"}])
    stream = rng.random() < 0.4
    path = f"/v2/models/{model}/{'generate_stream' if stream else 'generate'}"
    if rng.random() < 0.1:
        path = rng.choice([f"/v2/models/nope/generate", f"/v2/models/{model}/versions/9/generate",
                           f"/v2/models/{model}/versions/x/generate_stream", f"/v2/models/{model}/generat"])
    return Case(index, "http_raw", path, body, headers, stream=stream)


DATATYPES = ["BYTES", "BOOL", "INT32", "INT64", "UINT8", "UINT32", "FP16", "BF16", "FP32", "FP64", "STRING",
             "bogus", ""]
SHAPES = [[1], [1], [1], [2], [1, 1], [], [3], [-1], [1, 2**40]]


def gen_http_infer(rng: random.Random, model: str, index: int) -> Case:
    inputs = []
    for _ in range(rng.randint(0, 3)):
        dtype = rng.choice(DATATYPES)
        shape = rng.choice(SHAPES)
        data = rng.choice([["Hi"], [True], [1], [1.5], ["\xc3\x28"], [rand_value(rng)], rand_value(rng), []])
        inputs.append({"name": rng.choice(INPUT_NAMES + JUNK_KEYS[:3]), "datatype": dtype, "shape": shape,
                       "data": data})
    body = {"inputs": inputs}
    if rng.random() < 0.3:
        body["parameters"] = gen_sampling_dict(rng)
    if rng.random() < 0.2:
        body["outputs"] = [{"name": rng.choice(["text_output", "bogus"])}]
    if rng.random() < 0.1:
        body["id"] = rand_value(rng)
    path = rng.choice([f"/v2/models/{model}/infer", f"/v2/models/{model}/versions/1/infer",
                       f"/v2/models/{model}/versions/2/infer", "/v2/models/nope/infer",
                       f"/v2/models/{model}/versions/abc/infer"])
    text = to_json(rng, body)
    headers = {"Content-Type": "application/json"}
    if rng.random() < 0.2:  # the binary tensor extension, its header length sometimes wrong
        blob = struct.pack("<I", 3) + b"\xc3\x28\xff"
        headers = {"Content-Type": "application/octet-stream",
                   "Inference-Header-Content-Length": str(len(text) + rng.choice([0, 0, -1, 5, 10**6]))}
        text += blob
    return Case(index, "http_infer", path, text, headers)


def serialize_bytes(items: list[bytes]) -> bytes:
    """Triton's BYTES tensor layout: each element as a 4-byte little-endian length and its bytes."""
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def rand_bytes_item(rng: random.Random) -> bytes:
    return rng.choice([b"Hello", b"caf\xc3\x28", b"\xff\xfe", b"\xed\xa0\x80",  # a lone surrogate as UTF-8
                       b"\x00", b"", "\u00e9t\u00e9 \U0001f600".encode(), b"x" * (1 << 20), b"x" * ((1 << 20) + 1)])


def rand_tensor_data(rng: random.Random, dtype: str, shape: list[int]) -> bytes:
    """Raw contents for a tensor: the right size for dtype and shape, or not. Never empty (see module doc)."""
    n = max(1, math.prod(d for d in shape if d > 0) if shape else 1)
    width = {"BOOL": 1, "UINT8": 1, "INT32": 4, "UINT32": 4, "FP16": 2, "BF16": 2, "FP32": 4, "INT64": 8,
             "FP64": 8}.get(dtype)
    if dtype == "BYTES" or width is None:
        data = serialize_bytes([rand_bytes_item(rng) for _ in range(min(n, 3))])
    else:
        data = bytes(rng.choice([0, 1, 2, 255]) for _ in range(width * min(n, 64)))
    r = rng.random()
    if r < 0.1:
        data = data[:-1] or b"\x00"  # one byte short
    elif r < 0.15:
        data = struct.pack("<I", 1000) + b"abc"  # a length prefix past the end
    elif r < 0.2:
        data += b"\x01"
    return data


def _grpc_param(value) -> pb.InferParameter:
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int) and -2**63 <= value < 2**63:
        return pb.InferParameter(int64_param=value)
    if isinstance(value, int) and 0 <= value < 2**64:
        return pb.InferParameter(uint64_param=value)
    if isinstance(value, float):
        return pb.InferParameter(double_param=value)
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    # proto3 strings must be valid UTF-8: lone surrogates go out escaped
    return pb.InferParameter(string_param=text.encode("utf-8", "backslashreplace").decode("utf-8"))


def gen_grpc_request(rng: random.Random, model: str) -> pb.ModelInferRequest:
    clean = rng.random() < 0.3  # only values the server takes
    tensors = [["text_input", "BYTES", [1], serialize_bytes([rng.choice(PROMPTS[:6]).encode()])]]
    for name in rng.sample(INPUT_NAMES[1:], rng.randint(0, 3)):
        if name == "sampling_parameters":
            text = gen_sampling_text(rng, clean)
            tensors.append([name, "BYTES", [1], serialize_bytes([text if isinstance(text, bytes)
                                                                 else text.encode("utf-8", "surrogatepass")])])
        else:
            tensors.append([name, "BOOL", [1], bytes([rng.choice([0, 1, 1] if clean else [0, 1, 1, 2])])])
    if not any(t[0] == "stream" for t in tensors) and rng.random() < 0.4:
        tensors.append(["stream", "BOOL", [1], b"\x01"])
    if any(t[0] == "stream" and t[3] != b"\x00" for t in tensors) and not any(
            t[0] == "exclude_input_in_output" for t in tensors):
        tensors.append(["exclude_input_in_output", "BOOL", [1], b"\x01"])
    if any(t[0] == "exclude_input_in_output" and t[3] == b"\x00" for t in tensors) and clean:
        tensors = [t for t in tensors if t[0] != "stream"]
    for _ in range(0 if clean else rng.choice([0, 0, 1, 1, 2, 3])):  # mutations
        t = rng.choice(tensors)
        m = rng.randrange(8)
        if m == 0:  # the prompt: invalid UTF-8, empty, too long, broken
            t[3] = serialize_bytes([rand_bytes_item(rng)]) if t[1] == "BYTES" else rand_tensor_data(rng, t[1], t[2])
        elif m == 1:  # another datatype, data to match it (or not)
            t[1] = rng.choice(DATATYPES)
            t[3] = rand_tensor_data(rng, t[1], t[2])
        elif m == 2:  # another shape
            t[2] = rng.choice(SHAPES)
            t[3] = rand_tensor_data(rng, t[1], t[2])
        elif m == 3:
            t[3] = rand_tensor_data(rng, t[1], t[2])
        elif m == 4:  # an input the model does not declare
            tensors.append([rng.choice(JUNK_KEYS[:4] + ["TEXT_INPUT", "text_output"]), rng.choice(DATATYPES),
                            rng.choice(SHAPES), b"\x01\x00\x00\x00x"])
        elif m == 5 and len(tensors) > 1:  # the same input twice
            tensors.append(list(rng.choice(tensors)))
        elif m == 6 and rng.random() < 0.5:  # no prompt
            tensors = [x for x in tensors if x[0] != "text_input"] or [["stream", "BOOL", [1], b"\x00"]]
        elif m == 7:  # a huge declared shape
            t[2] = [rng.choice([2**31, 2**62, -2])]
    req = pb.ModelInferRequest(model_name=model)
    r = 1.0 if clean else rng.random()
    if r < 0.05:
        req.model_name = rng.choice(["nope", "", model.upper()])
    elif r < 0.12:
        req.model_version = rng.choice(["1", "2", "abc", "-1", "0"])
    if not clean and rng.random() < 0.1:
        req.id = rng.choice(["", "x" * 10_000, "\u00e9\U0001f600", "id with spaces", "\\ud800"])
    params = {"max_tokens": rng.randint(1, 4)} if rng.random() < 0.85 else {}
    for key in rng.sample(SAMPLING_KEYS, rng.randint(0, 3)):
        if not (clean and key in ("stop", "stop_token_ids", "priority")):  # lists; Triton's own "priority"
            params[key] = good_value(rng, key) if clean or rng.random() < 0.5 else rand_value(rng)
    for _ in range(0 if clean else rng.choice([0, 0, 0, 1])):
        params[rng.choice(JUNK_KEYS)] = rand_value(rng)
    for key, value in params.items():
        if value is None or isinstance(value, (list, dict)) and rng.random() < 0.5:
            continue
        req.parameters[key.encode("utf-8", "backslashreplace").decode()].CopyFrom(_grpc_param(value))
    req.parameters["triton_enable_empty_final_response"].CopyFrom(pb.InferParameter(bool_param=True))
    typed = not clean and rng.random() < 0.08
    for name, dtype, shape, data in tensors:
        tensor = req.inputs.add(name=name, datatype=dtype, shape=shape)
        if typed:  # typed contents instead of raw bytes: BYTES as bytes_contents, the rest as ints
            if dtype == "BYTES":
                tensor.contents.bytes_contents.append(data[4:] or b"x")
            elif dtype == "BOOL":
                tensor.contents.bool_contents.append(bool(data[0]))
            else:
                tensor.contents.int_contents.append(data[0])
        else:
            req.raw_input_contents.append(data)  # never empty: see the module doc
    return req


def gen_grpc_stream(rng: random.Random, model: str, index: int) -> Case:
    return Case(index, "grpc_stream", message=gen_grpc_request(rng, model))


def gen_grpc_unary(rng: random.Random, model: str, index: int) -> Case:
    return Case(index, "grpc_unary", message=gen_grpc_request(rng, model))


GENERATORS = {"http_generate": gen_http_generate, "http_raw": gen_http_raw, "http_infer": gen_http_infer,
              "grpc_stream": gen_grpc_stream, "grpc_unary": gen_grpc_unary}


def make_case(seed: int, index: int, model: str, kinds: tuple[str, ...] = tuple(KIND_WEIGHTS)) -> Case:
    """Case `index` of the run seeded `seed`: the same whatever the other cases were."""
    rng = random.Random(f"{seed}/{index}")
    kind = rng.choices(kinds, weights=[KIND_WEIGHTS[k] for k in kinds])[0]
    return GENERATORS[kind](rng, model, index)


# ----------------------------------------------------------------------------------------------
# Sending and classifying
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    outcome: str
    detail: str  # status and message
    seconds: float = 0.0


def _short(text: str) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} chars)"


def _by_message(message: str, refusal: str = INVALID) -> str:
    """A refusal with a message is `refusal`, unless the message is one of our internal errors."""
    if not message.strip():
        return BAD_ANSWER
    return SERVER_ERROR if any(m in message for m in INTERNAL_MARKERS) else refusal


def _http_message(body: bytes) -> str:
    """The error message of an HTTP answer: {"error": ...}, as JSON or as generate_stream's one SSE event."""
    if body.startswith(b"data:"):
        body = body[5:]
    try:
        obj = json.loads(body)
        return str(obj.get("error", "")) if isinstance(obj, dict) else ""
    except ValueError:
        return body.decode("utf-8", "replace")


@dataclass
class Target:
    http_url: str  # host:port
    grpc_url: str
    model: str
    timeout: float = 120.0
    cancel_streams: bool = False  # cancel a gRPC stream once answered, instead of closing it
    _channel: grpc.Channel | None = field(default=None, repr=False)

    @property
    def stub(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.grpc_url, options=[
                ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)])
        return service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    def close(self):
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def send_http(case: Case, target: Target) -> Answer:
    deadline = time.monotonic() + target.timeout
    try:
        with requests.post(f"http://{target.http_url}{case.path}", data=case.body, stream=True,
                           headers={**CLOSE, **case.headers}, timeout=(10, target.timeout)) as r:
            chunks, parser, events = [], SSEParser(), []
            for chunk in r.iter_content(chunk_size=None):
                if time.monotonic() > deadline:
                    return Answer(TIMEOUT, f"HTTP {r.status_code}: still streaming after {target.timeout} s")
                chunks.append(chunk)
                if case.stream and r.status_code == 200:
                    events += parser.feed(chunk)
            body = b"".join(chunks)
    except requests.Timeout as e:
        return Answer(TIMEOUT, f"{type(e).__name__}: {e}")
    except requests.RequestException as e:
        return Answer(CONNECTION_ERROR, f"{type(e).__name__}: {e}")
    status = r.status_code
    if status == 200:
        if case.stream:
            objs = []
            for ev in events:
                try:
                    objs.append(json.loads(ev.data))
                except ValueError:
                    return Answer(BAD_ANSWER, _short(f"HTTP 200, event not JSON: {ev.data}"))
            errors = [str(o.get("error")) for o in objs if isinstance(o, dict) and "error" in o]
            if errors:
                return Answer(_by_message(errors[0]), _short(f"HTTP 200, error event: {errors[0]}"))
            if not any(isinstance(o, dict) and "text_output" in o for o in objs) or parser.partial:
                return Answer(BAD_ANSWER, _short(f"HTTP 200 stream without text_output: {body[:200]!r}"))
            return Answer(OK, f"HTTP 200, {len(objs)} events")
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and "text_output" in obj:
            return Answer(OK, _short(f"HTTP 200: {body[:200]!r}"))
        if isinstance(obj, dict) and "error" in obj:  # /generate given a streamed answer
            return Answer(_by_message(str(obj["error"]), TRITON_FRONT_END), _short(f"HTTP 200: {obj['error']}"))
        return Answer(BAD_ANSWER, _short(f"HTTP 200: {body[:200]!r}"))
    message = _http_message(body)
    detail = _short(f"HTTP {status}: {message}")
    if 400 <= status < 500:
        return Answer(_by_message(message), detail)
    if status >= 500:
        return Answer(_by_message(message, TRITON_FRONT_END), detail)
    return Answer(BAD_ANSWER, detail)


def _grpc_error(e: grpc.RpcError) -> Answer:
    code, message = e.code(), e.details() or ""
    detail = _short(f"gRPC {code.name}: {message}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Answer(TIMEOUT, detail)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return Answer(CONNECTION_ERROR, detail)
    if code in GRPC_REFUSALS:
        return Answer(_by_message(message), detail)
    return Answer(SERVER_ERROR, detail)


def send_grpc_stream(case: Case, target: Target) -> Answer:
    done = threading.Event()

    def requests_iter():
        yield case.message
        done.wait(target.timeout + 5)  # the stream stays open until its answer is complete

    call = target.stub.ModelStreamInfer(requests_iter(), timeout=target.timeout)
    outputs, answer = 0, None
    try:
        for resp in call:
            if answer is not None:
                continue  # after the answer: drain until the server closes the stream
            if resp.error_message:
                answer = Answer(_by_message(resp.error_message), _short(f"stream error: {resp.error_message}"))
            else:
                outputs += len(resp.infer_response.outputs)
                final = resp.infer_response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    answer = Answer(OK if outputs else BAD_ANSWER, f"stream: {outputs} output tensors")
            if answer is not None:
                if target.cancel_streams:
                    call.cancel()
                done.set()  # half-close: the server ends the stream once nothing is in flight
        return answer or Answer(BAD_ANSWER, "the stream ended without a final response")
    except grpc.RpcError as e:
        return answer or _grpc_error(e)  # (CANCELLED after our own cancel)
    finally:
        done.set()


def send_grpc_unary(case: Case, target: Target) -> Answer:
    try:
        resp = target.stub.ModelInfer(case.message, timeout=target.timeout)
    except grpc.RpcError as e:
        return _grpc_error(e)
    return Answer(OK if resp.outputs else BAD_ANSWER, f"ModelInfer: {len(resp.outputs)} outputs")


def send(case: Case, target: Target) -> Answer:
    t0 = time.monotonic()
    if case.kind == "grpc_unary":
        a = send_grpc_unary(case, target)
    elif case.message is not None:
        a = send_grpc_stream(case, target)
    else:
        a = send_http(case, target)
    return Answer(a.outcome, a.detail, round(time.monotonic() - t0, 3))


def good_cases(model: str) -> list[Case]:
    """A good request over HTTP /generate and one over a gRPC stream: both must succeed."""
    req = pb.ModelInferRequest(model_name=model)
    req.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    req.raw_input_contents.append(serialize_bytes([b"Hello"]))
    for key, value in (("max_tokens", 2), ("temperature", 0), ("ignore_eos", True),
                       ("triton_enable_empty_final_response", True)):
        req.parameters[key].CopyFrom(_grpc_param(value))
    return [Case(-1, "check_http", f"/v2/models/{model}/generate", json.dumps(GOOD).encode(),
                 {"Content-Type": "application/json"}),
            Case(-1, "check_grpc", message=req)]


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------


def run_fuzz(http_url: str, grpc_url: str, model: str, cases: int = 300, seed: int = 0,
             check_every: int = 50, timeout: float = 120.0, workers: int = 2, only: list[int] | None = None,
             kinds: tuple[str, ...] = tuple(KIND_WEIGHTS), cancel_streams: bool = False, log=None) -> dict:
    """Send the cases, check a good request after every `check_every`; returns the summary (a dict)."""
    target = Target(http_url, grpc_url, model, timeout, cancel_streams)
    indices = list(only) if only else list(range(cases))
    counts: Counter = Counter()
    by_kind: dict[str, Counter] = defaultdict(Counter)
    messages: dict[str, Counter] = defaultdict(Counter)
    examples: dict[str, list] = defaultdict(list)
    checks = {"run": 0, "failed": 0, "failures": []}
    slowest = []
    start = time.monotonic()

    def one(i: int):
        case = make_case(seed, i, model, kinds)
        return case, send(case, target)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for lo in range(0, len(indices), check_every):
            for case, a in pool.map(one, indices[lo:lo + check_every]):
                counts[a.outcome] += 1
                by_kind[case.kind][a.outcome] += 1
                messages[a.outcome][a.detail[:120]] += 1
                slowest.append((a.seconds, case.index, case.kind, a.outcome))
                if a.outcome not in (OK, INVALID) and len(examples[a.outcome]) < 25:
                    examples[a.outcome].append({"case": case.index, "kind": case.kind, "sent": case.describe(),
                                                "answer": a.detail, "seconds": a.seconds})
                if log:
                    log(f"[{case.index}] {case.kind}: {a.outcome} ({a.seconds:.2f} s) {a.detail[:160]}")
            for good in good_cases(model):
                checks["run"] += 1
                a = send(good, target)
                if a.outcome != OK:
                    checks["failed"] += 1
                    if len(checks["failures"]) < 25:
                        checks["failures"].append({"after_case": indices[min(lo + check_every, len(indices)) - 1],
                                                   "kind": good.kind, "answer": a.detail})
            if log:
                log(f"-- {min(lo + check_every, len(indices))}/{len(indices)} cases, {dict(counts)}, "
                    f"checks failed {checks['failed']}/{checks['run']}")
    target.close()
    violations = sum(n for o, n in counts.items() if o not in ALLOWED)
    return {
        "cases": len(indices), "seed": seed, "workers": workers, "timeout_s": timeout, "check_every": check_every,
        "duration_s": round(time.monotonic() - start, 1),
        "outcomes": {o: counts.get(o, 0) for o in OUTCOMES},
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "checks": checks,
        "rule": "every case ok, invalid or triton_front_end; every good request after a batch succeeds",
        "rule_ok": violations == 0 and checks["failed"] == 0,
        "violations": violations,
        "top_messages": {o: dict(messages[o].most_common(30)) for o in OUTCOMES if messages[o]},
        "examples": dict(examples),
        "slowest": [{"seconds": s, "case": i, "kind": k, "outcome": o}
                    for s, i, k, o in sorted(slowest, reverse=True)[:10]],
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.fuzz", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--http-url", default="127.0.0.1:8000", help="Triton HTTP host:port")
    p.add_argument("--grpc-url", default="127.0.0.1:8001", help="Triton gRPC host:port")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--cases", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-every", type=int, default=50, help="a good request must succeed after this many cases")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for one answer; longer is a hang")
    p.add_argument("--workers", type=int, default=2, help="cases in flight at once")
    p.add_argument("--only", type=int, nargs="*", help="only these case indices (replay)")
    p.add_argument("--kinds", nargs="+", choices=list(KIND_WEIGHTS), default=list(KIND_WEIGHTS),
                   help="draw cases of these kinds only")
    p.add_argument("--cancel-streams", action="store_true",
                   help="cancel each gRPC stream once answered instead of closing it (Triton 2.51 then keeps a "
                        "model reference after a request its core refused: the server's stop waits out its "
                        "exit timeout)")
    p.add_argument("--start-server", action="store_true",
                   help="start tritonserver (this model only, alrkvd-serve's launcher) on free loopback ports, "
                        "stop it at the end")
    p.add_argument("--out", default=None, help="write the JSON summary here")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    launcher = None
    if args.start_server:
        from loadtest.run import start_server
        from server.serve import free_ports

        http, grpc_port = free_ports(2)
        args.http_url, args.grpc_url = f"127.0.0.1:{http}", f"127.0.0.1:{grpc_port}"
        log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"fuzz_tritonserver_{os.getpid()}.log"
        launcher = start_server(f"http://{args.http_url}", args.grpc_url, [args.model], 900.0, log_path)
    try:
        log = (lambda line: print(line, flush=True)) if args.verbose else None
        summary = run_fuzz(args.http_url, args.grpc_url, args.model, args.cases, args.seed, args.check_every,
                           args.timeout, args.workers, args.only, tuple(args.kinds), args.cancel_streams,
                           log=log or (lambda line: line.startswith("--") and print(line, flush=True)))
    finally:
        stop_s = None
        if launcher is not None:
            t0 = time.monotonic()
            launcher.stop()
            stop_s = round(time.monotonic() - t0, 1)
    summary = {"command": " ".join(["python -m loadtest.fuzz", *(argv if argv is not None else sys.argv[1:])]),
               "date": time.strftime("%Y-%m-%d %H:%M:%S"), "model": args.model,
               **({"server_stop_s": stop_s} if stop_s is not None else {}), **summary}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        print(f"summary: {args.out}")
    print(json.dumps({k: summary[k] for k in ("cases", "duration_s", "outcomes", "checks", "rule_ok")}, default=str))
    return 0 if summary["rule_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
