"""Property-based tests (Hypothesis) of what a request may carry: `SamplingParams.from_dict` / `.validate`
(backend/sampling.py), the sampler, and the Triton model's pure request parser
(model_repository/smollm2/1/request_parsing.py, `parse_inputs`, which model.py calls through
triton_request.py on every request's tensors).

The property: any input either parses into values the engine can use (checked by running the sampler
with them on random logits, and getting a token of the vocabulary) or is refused with the project's own
error and a message (`ValueError` from sampling.py, `RequestError` INVALID_ARG from the parser), never
another exception and never a hang (Hypothesis' deadline). Inputs: random JSON (wrong types, huge and
negative ints, NaN/inf/-0.0/denormals, odd Unicode, lone surrogates, invalid UTF-8, deep nesting, long
strings) and numpy arrays of any dtype and shape. ALRKVD_FUZZ_EXAMPLES sets the examples per property
(default 150: a few seconds each). The server-level fuzz is loadtest/fuzz.py (tests/server/test_fuzz.py).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from backend.sampling import MAX_STOP_STRINGS, RequestLimits, SamplingParams, sample

MODEL_DIR = Path(__file__).resolve().parents[2] / "model_repository" / "smollm2" / "1"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, MODEL_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")  # the long strings
rp = _load("request_parsing")  # pure: no triton_python_backend_utils

VOCAB = 300  # small, so the sampler runs fast; limits below bound top_k and stop_token_ids by it
LIMITS = RequestLimits(max_model_len=2048, vocab_size=VOCAB, max_output_tokens=512)
MAX_MESSAGE = 2000
FUZZ = settings(max_examples=int(os.environ.get("ALRKVD_FUZZ_EXAMPLES", "150")), deadline=timedelta(seconds=5),
                database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ----------------------------------------------------------------------------------------------
# Strategies
# ----------------------------------------------------------------------------------------------

FIELDS = ["max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos"]
any_char = st.characters(exclude_categories=())  # lone surrogates included
odd_text = st.one_of(
    st.text(any_char, max_size=20),
    st.sampled_from(["", " ", "\x00", "\ud800", "x\udc80y", "\u202e", "\ufeff", "\U0001f600", "\u00b2", "\u0663",
                     "1e400", "nan", "-inf", "-0", "0x10", "1_0", " 7 ", "--5", "+3", "true", "FALSE", "null",
                     "9" * 5000, "\u00e9" * 3000]),
    st.integers(0, 200_000).map(lambda n: "x" * n),
)
edge_ints = st.one_of(st.integers(), st.sampled_from([0, -1, 1, 2**31, 2**63 - 1, 2**63, -2**63 - 1, 2**64,
                                                      10**30, 10**400, -10**400]))
edge_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
                        st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 1e-5, 9.99e-6, 100.0, 100.00000000000001,
                                         math.nan, math.inf, -math.inf]))
scalars = st.one_of(st.none(), st.booleans(), edge_ints, edge_floats, odd_text)
json_like = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                        st.dictionaries(odd_text, kids, max_size=4)),
                         max_leaves=12)

# values the engine takes for each field (at the limits' edges too)
good = {
    "max_tokens": st.integers(1, LIMITS.max_output_tokens),
    "temperature": st.one_of(st.floats(0, 100, allow_subnormal=True), st.integers(0, 100)),
    "top_p": st.one_of(st.floats(0, 1, exclude_min=True, allow_subnormal=True), st.just(1)),
    "top_k": st.integers(-1, VOCAB),
    "seed": st.one_of(st.none(), st.integers(0, 2**63 - 1)),
    "stop": st.one_of(st.text(any_char, min_size=1, max_size=8),
                      st.lists(st.text(any_char, min_size=1, max_size=8), max_size=MAX_STOP_STRINGS)),
    "stop_token_ids": st.lists(st.integers(0, VOCAB - 1), max_size=8),
    "ignore_eos": st.booleans(),
}
good_dicts = st.fixed_dictionaries({}, optional=good)
# a field's value: usually good, sometimes anything; plus unknown keys of any type
mixed_dicts = st.builds(
    lambda base, bad, junk: {**base, **bad, **junk},
    good_dicts,
    st.dictionaries(st.sampled_from(FIELDS), json_like, max_size=3),
    st.one_of(st.just({}), st.dictionaries(st.one_of(odd_text, edge_ints, edge_floats, st.booleans()),
                                           json_like, max_size=3)),
)
logits_spec = st.tuples(st.integers(1, 4), st.integers(0, 2**32 - 1), st.sampled_from([1e-3, 1.0, 30.0, 1e4]),
                        st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
                        st.sampled_from(["randn", "ties", "masked"]))


def make_logits(batch: int, seed: int, scale: float, dtype, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, VOCAB, generator=g) * scale
    if kind == "ties":
        x = torch.zeros(batch, VOCAB)
    elif kind == "masked":  # most of the vocabulary banned, as grammar or bad-word masks do
        x[torch.rand(batch, VOCAB, generator=g) < 0.9] = float("-inf")
        x[:, 0] = 0.0
    return x.clamp(-6e4, 6e4).to(dtype) if dtype == torch.float16 else x.to(dtype)


def assert_usable(p: SamplingParams, logits: torch.Tensor):
    """p is what validate promises, and the sampler gives a token of the vocabulary for every row."""
    assert isinstance(p.max_tokens, int) and 1 <= p.max_tokens <= LIMITS.max_output_tokens
    assert isinstance(p.temperature, float) and 0 <= p.temperature <= 100
    assert isinstance(p.top_p, float) and 0 < p.top_p <= 1
    assert isinstance(p.stop, list) and all(isinstance(s, str) and s for s in p.stop)
    assert all(isinstance(t, int) and 0 <= t < VOCAB for t in p.stop_token_ids)
    params = [p] * logits.shape[0]
    gens = [torch.Generator().manual_seed(p.seed) if p.seed is not None else None] * logits.shape[0]
    tokens = sample(logits, params, gens)
    assert len(tokens) == logits.shape[0]
    for row, tok in zip(logits, tokens):
        assert not isinstance(tok, Exception), repr(tok)
        assert isinstance(tok, int) and 0 <= tok < VOCAB
        assert torch.isfinite(row[tok].float()), "sampled a banned (-inf) token"
        if p.top_k > 0:  # within the top k (ties at the k-th value count)
            assert row[tok] >= torch.topk(row.float(), min(p.top_k, VOCAB)).values[-1]


def assert_refusal(e: Exception):
    message = str(e)
    assert message and len(message) <= MAX_MESSAGE, message[:300]


# ----------------------------------------------------------------------------------------------
# SamplingParams.from_dict / validate, and the sampler
# ----------------------------------------------------------------------------------------------


@FUZZ
@given(d=st.one_of(good_dicts, mixed_dicts, json_like), logits=logits_spec)
@example(d={1: 2, "a": 3}, logits=(1, 0, 1.0, torch.float32, "randn"))  # keys that do not sort together
@example(d={"temperature": 10**400}, logits=(1, 0, 1.0, torch.float32, "randn"))  # repr past 4,300 digits
@example(d={"stop": ["x" * 10**6, 5]}, logits=(1, 0, 1.0, torch.float32, "randn"))
@example(d={"temperature": 1e-5, "top_k": 1}, logits=(2, 0, 1e4, torch.float32, "randn"))
@example(d={"top_p": 5e-324, "temperature": 100}, logits=(2, 0, 1.0, torch.bfloat16, "ties"))
@example(d=[["max_tokens", 1]], logits=(1, 0, 1.0, torch.float32, "randn"))  # not a mapping
def test_sampling_params_parse_or_refuse(d, logits):
    try:
        p = SamplingParams.from_dict(d, LIMITS)
    except ValueError as e:
        assert_refusal(e)
        return
    p.validate(LIMITS)  # the engine validates again at add_request: idempotent
    assert_usable(p, make_logits(*logits))


@FUZZ
@given(d=good_dicts, logits=logits_spec)
def test_valid_sampling_params_always_sample(d, logits):
    """Every combination of valid values samples, whatever the logits (scale, dtype, ties, masks)."""
    assert_usable(SamplingParams.from_dict(d, LIMITS), make_logits(*logits))


@FUZZ
@given(fields_=st.fixed_dictionaries({}, optional={k: json_like for k in FIELDS}))
def test_validate_parse_or_refuse(fields_):
    """validate() on a SamplingParams built directly (as engine users do), fields of any type."""
    p = SamplingParams(**fields_)
    try:
        p.validate(LIMITS)
    except ValueError as e:
        assert_refusal(e)
        return
    assert_usable(p, make_logits(1, 0, 1.0, torch.float32, "randn"))


# ----------------------------------------------------------------------------------------------
# The Triton model's request parser
# ----------------------------------------------------------------------------------------------


def _json_text(value, raw_surrogates: bool) -> bytes:
    text = json.dumps(value, ensure_ascii=not raw_surrogates)
    return text.encode("utf-8", "surrogatepass")  # lone surrogates become invalid UTF-8 bytes


sampling_json = st.one_of(
    st.builds(_json_text, st.one_of(good_dicts, mixed_dicts), st.booleans()),
    st.builds(_json_text, json_like, st.booleans()),
    st.sampled_from([b"{not json", b"", b"   ", b"null", b"[1, 2]", b'"x"', b"1e999", b'{"max_tokens": NaN}',
                     b'{"max_tokens": 1' + b"0" * 5000 + b"}", b'{"a": 1,}', b'{"max_tokens": 2} x',
                     b'{"stop": "\xc3\x28"}', b"\xff\xfe", b'{"priority": "\xc2\xb2"}']),
    st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n),  # past Python's recursion limit
    st.integers(1, 50_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.binary(max_size=64),
)
prompt_bytes = st.one_of(
    st.text(max_size=40).map(lambda s: s.encode("utf-8")),
    st.binary(max_size=40),  # mostly invalid UTF-8
    st.sampled_from([b"", b"\xed\xa0\x80", b"caf\xc3\x28", b"x" * (1 << 20), b"x" * ((1 << 20) + 1)]),
)


def _bytes_tensor(items) -> np.ndarray:
    return np.array(items, dtype=np.object_)


chat_json = st.one_of(  # the `messages` input: chats, and JSON that is no chat
    st.builds(lambda m: json.dumps(m).encode(), st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "", 7]),
         "content": st.one_of(odd_text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": odd_text}),
                                                 max_size=2), st.none(), edge_ints)},
        optional={"name": odd_text}), max_size=3)),
    st.builds(lambda v: json.dumps(v).encode(), json_like), prompt_bytes)
RIGHT = {"prompt": prompt_bytes, "json": sampling_json, "messages": chat_json}


def tensor_for(kind: str):
    """A numpy array for one input: of the right type and shape, or any other."""
    right = (st.builds(lambda b: _bytes_tensor([b]), RIGHT[kind])
             if kind in RIGHT else st.booleans().map(lambda b: np.array([b], dtype=bool)))
    wrong = st.one_of(
        st.builds(lambda xs: _bytes_tensor(xs), st.lists(prompt_bytes, max_size=3)),  # 0, 2, 3 elements
        st.builds(lambda x: _bytes_tensor([x]), st.one_of(odd_text, edge_ints, st.none(), st.booleans())),
        st.builds(lambda x: np.array([[x]], dtype=np.object_), prompt_bytes),
        st.builds(lambda x: np.array(x), st.one_of(st.integers(-5, 5), st.floats(allow_nan=True), st.booleans())),
        st.builds(lambda xs: np.array(xs, dtype=np.int32), st.lists(st.integers(-2**31, 2**31 - 1), max_size=3)),
        st.builds(lambda xs: np.array(xs, dtype=np.float32), st.lists(st.floats(width=32), max_size=3)),
        st.builds(lambda x: np.array([x], dtype=np.uint8), st.integers(0, 255)),
        st.builds(lambda x: np.array([x], dtype="U5"), st.text(max_size=5)),
    )
    return st.one_of(right, right, right, wrong)


INPUT_KINDS = {"text_input": "prompt", "messages": "messages", "stream": "bool", "sampling_parameters": "json",
               "exclude_input_in_output": "bool", "return_finish_reason": "bool",
               "return_num_input_tokens": "bool", "return_num_output_tokens": "bool"}
inputs_dicts = st.fixed_dictionaries(  # None: the input is absent
    {"text_input": st.one_of(tensor_for("prompt"), st.none())},
    optional={k: tensor_for(v) for k, v in INPUT_KINDS.items() if k != "text_input"})
parameters_text = st.one_of(
    st.just(""), st.just("{}"),
    st.builds(lambda d: json.dumps(d), st.one_of(good_dicts, mixed_dicts, st.dictionaries(odd_text, json_like,
                                                                                        max_size=4))),
    st.builds(lambda v: json.dumps({"id": v, "priority": v}), json_like),
    st.sampled_from(["[1]", "null", "{not json", '{"priority": "\u00b2"}', '{"priority": "--5"}',
                     '{"priority": 1' + "0" * 30 + "}", '{"id": "' + "i" * 10_000 + '"}', "[" * 50_000]),
)


@FUZZ
@given(inputs=inputs_dicts, parameters=parameters_text, logits=logits_spec)
@example(inputs={"text_input": _bytes_tensor([b"Hi"])}, parameters='{"priority": "\u00b2"}',
         logits=(1, 0, 1.0, torch.float32, "randn"))  # isdigit() but not int(): was INTERNAL
@example(inputs={"text_input": _bytes_tensor([b"Hi"]), "sampling_parameters": _bytes_tensor([b"[" * 100_000])},
         parameters="", logits=(1, 0, 1.0, torch.float32, "randn"))  # RecursionError: was INTERNAL
@example(inputs={"text_input": _bytes_tensor(["caf\udce9"])}, parameters="",
         logits=(1, 0, 1.0, torch.float32, "randn"))  # a str that is no UTF-8
@example(inputs={"text_input": _bytes_tensor([b"\x00"])}, parameters='{"id": "' + "i" * 10_000 + '"}',
         logits=(1, 0, 1.0, torch.float32, "randn"))  # an id over MAX_ID_CHARS: was accepted (found 2026-12-05)
def test_parse_inputs_parse_or_refuse(inputs, parameters, logits):
    try:
        r = rp.parse_inputs(inputs, parameters, SamplingParams, LIMITS)
    except rp.RequestError as e:
        assert e.code == "INVALID_ARG"
        assert_refusal(e)
        return
    if isinstance(r.prompt, list):  # a chat: messages of string roles and contents, never repeated in the output
        assert r.prompt and all(isinstance(m["role"], str) and m["role"] and isinstance(m["content"], str)
                                for m in r.prompt) and not r.prepend_input
        assert "text_input" not in inputs
    else:
        assert isinstance(r.prompt, str) and r.prompt and "messages" not in inputs
        assert len(r.prompt.encode("utf-8")) <= rp.MAX_PROMPT_BYTES  # encodes: no lone surrogates
    assert isinstance(r.priority, int) and not isinstance(r.priority, bool) and -2**63 <= r.priority < 2**63
    assert isinstance(r.stream, bool) and isinstance(r.prepend_input, bool) and not (r.stream and r.prepend_input)
    assert set(r.additional) == set(rp.ADDITIONAL_OUTPUTS) and all(isinstance(v, bool) for v in r.additional.values())
    assert r.generate_id is None or (isinstance(r.generate_id, str) and len(r.generate_id) <= rp.MAX_ID_CHARS)
    r.params.validate(LIMITS)
    assert_usable(r.params, make_logits(*logits))


@pytest.mark.parametrize("parameters,inputs,named", [
    ('{"priority": "\u00b2"}', {}, "priority"),
    ('{"priority": 99999999999999999999}', {}, "priority"),
    ("", {"sampling_parameters": [b"[" * 20_000]}, "nested too deeply"),
    ("", {"sampling_parameters": [b'{"stop": "\xc3\x28"}']}, "not valid JSON"),
    ('{"' + "k" * 5000 + '": 1}', {}, "unknown sampling parameter"),
    ('{"max_tokens": "9' + "9" * 5000 + '"}', {}, "max_tokens"),
    ("", {"stream": [np.int32(1)]}, "must be BOOL"),
    ("", {"text_input": [7]}, "must be a string"),
    ("", {"messages": [b'[{"role": "user", "content": "Hi"}]']}, "give one of"),
])
def test_refusals_name_the_problem(parameters, inputs, named):
    """The cases the fuzzing found (INTERNAL errors before) and their bounded messages."""
    arrays = {"text_input": _bytes_tensor([b"Hi"])}
    arrays.update({k: np.array(v, dtype=np.object_) for k, v in inputs.items()})
    with pytest.raises(rp.RequestError) as e:
        rp.parse_inputs(arrays, parameters, SamplingParams, LIMITS)
    assert e.value.code == "INVALID_ARG" and named in str(e.value)
    assert len(str(e.value)) < 300


def test_good_request_parses():
    inputs = {"text_input": _bytes_tensor(["caf\u00e9".encode()]), "stream": np.array([True]),
              "exclude_input_in_output": np.array([True]),
              "sampling_parameters": _bytes_tensor([b'{"temperature": "0.5", "stop": "\\n", "max_tokens": 3}']),
              "return_finish_reason": np.array([True])}
    r = rp.parse_inputs(inputs, '{"priority": "-3", "id": 42, "ignore_eos": "true", "triton_x": 1}',
                        SamplingParams, LIMITS)
    assert (r.prompt, r.stream, r.prepend_input, r.priority, r.generate_id) == ("caf\u00e9", True, False, -3, "42")
    assert (r.params.temperature, r.params.stop, r.params.max_tokens, r.params.ignore_eos) == (0.5, ["\n"], 3, True)
    assert r.additional == {"return_finish_reason": True, "return_num_input_tokens": False,
                            "return_num_output_tokens": False}


@pytest.mark.parametrize("chat,named", [
    (b"[]", "non-empty JSON array"), (b'{"role": "user"}', "non-empty JSON array"), (b"[1", "not valid JSON"),
    (b'[{"content": "Hi"}]', "string 'role'"), (b'[{"role": "user", "content": 3}]', "'content'"),
    (b'[{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]', "'content'"),
    (b"[" + b'{"role": "user", "content": ""},' * 1100 + b'{"role": "user", "content": ""}]', "at most 1024"),
])
def test_chat_refusals_name_the_problem(chat, named):
    with pytest.raises(rp.RequestError) as e:
        rp.parse_inputs({"messages": _bytes_tensor([chat])}, "", SamplingParams, LIMITS)
    assert e.value.code == "INVALID_ARG" and named in str(e.value)


def test_chat_parses():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "name": "ann", "extra": 1,
                                                         "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}]
    r = rp.parse_inputs({"messages": _bytes_tensor([json.dumps(chat).encode()])}, "", SamplingParams, LIMITS)
    assert r.prompt == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there", "name": "ann"}]
    assert not r.prepend_input and not r.stream
    with pytest.raises(rp.RequestError, match="exclude_input_in_output"):
        rp.parse_inputs({"messages": _bytes_tensor([json.dumps(chat).encode()]),
                         "exclude_input_in_output": np.array([False])}, "", SamplingParams, LIMITS)
