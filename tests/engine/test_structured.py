"""Structured output (backend/structured.py) with the default model: JSON schemas (nested objects, enums,
arrays), any JSON object and a regular expression, in one batch of different grammars; every output
parses and validates; a schema that does not compile is refused when the request is added."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from backend.engine import EngineArgs, LLMEngine
from backend.sampling import SamplingParams

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "address"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0},
                         "address": {"type": "object", "required": ["city", "country"], "additionalProperties": False,
                                     "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "country": {"type": "string", "enum": ["France", "Italy"]}}}}}
SHOPPING = {"type": "object", "additionalProperties": False, "required": ["items"],
            "properties": {"items": {"type": "array", "minItems": 2, "maxItems": 4,
                                     "items": {"type": "object", "required": ["item", "unit"],
                                               "additionalProperties": False,
                                               "properties": {"item": {"type": "string", "maxLength": 20},
                                                              "unit": {"enum": ["kg", "piece", "litre"]}}}}}}
SENTIMENT = {"type": "object", "required": ["label", "confidence"], "additionalProperties": False,
             "properties": {"label": {"enum": ["positive", "negative", "neutral"]},
                            "confidence": {"type": "number", "minimum": 0, "maximum": 1}}}
DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])"

CASES = [
    ("Invent a person who lives in Europe, as JSON.", {"type": "json_schema", "json_schema": {"schema": PERSON}}),
    ("Write a shopping list as JSON.", {"type": "json_schema", "json_schema": {"name": "list", "schema": SHOPPING}}),
    ("Classify: 'I love this film.'", {"type": "json_schema", "json_schema": {"schema": SENTIMENT}}),
    ("Reply with a JSON object whose one key, \"colour\", names the colour of the sky.", {"type": "json_object"}),
    ("When did the Berlin Wall fall? Give the date.", {"type": "regex", "regex": DATE}),
]


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(EngineArgs(model="default", max_num_seqs=8))


def test_outputs_follow_their_formats_in_one_batch(engine):
    rids = [engine.add_request([{"role": "user", "content": q}],
                               SamplingParams(max_tokens=160, temperature=0, response_format=fmt))
            for q, fmt in CASES]
    done = {}
    while engine.has_unfinished():
        assert len(engine.running) + len(engine.waiting) <= len(CASES)
        done |= {o.request_id: o for o in engine.step() if o.finished}
    for rid, (_, fmt) in zip(rids, CASES):
        out = done[rid]
        assert out.finish_reason == "stop", (fmt, out.text)  # the grammar ended, not max_tokens
        if fmt["type"] == "regex":
            assert re.fullmatch(DATE, out.text), out.text
            continue
        value = json.loads(out.text)
        if fmt["type"] == "json_schema":
            jsonschema.validate(value, fmt["json_schema"]["schema"])
        else:
            assert isinstance(value, dict)


def test_sampled_outputs_follow_the_schema(engine):
    params = SamplingParams(max_tokens=160, temperature=1.0, seed=3,
                            response_format={"type": "json_schema", "json_schema": {"schema": SHOPPING}})
    for out in engine.generate([[{"role": "user", "content": "A shopping list, please."}]] * 3, params):
        jsonschema.validate(json.loads(out.text), SHOPPING)


@pytest.mark.parametrize("fmt,named", [
    ({"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}},
     "does not compile"),
    ({"type": "regex", "regex": "(unclosed"}, "does not compile"),
    ({"type": "json_schema"}, "json_schema needs"),
    ({"type": "xml"}, "'type'"),
    ("json", "'type'"),
])
def test_bad_formats_are_refused_at_the_door(engine, fmt, named):
    with pytest.raises(ValueError, match=named):
        engine.add_request("Hi", SamplingParams(max_tokens=4, response_format=fmt))
    assert not engine.has_unfinished()
