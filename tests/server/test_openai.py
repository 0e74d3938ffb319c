"""The OpenAI-compatible front (server/openai_front.py), started by the launcher beside the real tritonserver,
through the official `openai` client: chat with the model's own template, streamed text that joins up to the
non-streamed text, usage counts, stop strings, OpenAI-shaped errors, and a dropped stream that frees its KV."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import requests

from server_checks import assert_dropped_stream_frees_blocks

GREEDY = {"temperature": 0, "seed": 0}
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(triton_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=triton_server.openai_url, api_key="none", max_retries=0, timeout=300)


def test_models_lists_the_served_models(client, triton_server):
    assert set(triton_server.models) <= {m.id for m in client.models.list().data}


def test_chat_answers_with_the_chat_template(client, triton_server):
    r = client.chat.completions.create(model=triton_server.model, messages=FRANCE, max_tokens=30, **GREEDY)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 10 and 0 < r.usage.completion_tokens <= 30  # the template's tokens counted
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streamed_chat_joins_up_to_the_non_streamed_text(client, triton_server):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name three colours of the rainbow."}]
    whole = client.chat.completions.create(model=triton_server.model, messages=messages, max_completion_tokens=24,
                                           **GREEDY)
    chunks = list(client.chat.completions.create(model=triton_server.model, messages=messages, stream=True,
                                                 max_completion_tokens=24, stream_options={"include_usage": True},
                                                 **GREEDY))
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 3 and "".join(pieces) == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # include_usage: a last chunk


def test_completions_stream_and_stop(client, triton_server):
    prompt = "The three primary colours are"
    whole = client.completions.create(model=triton_server.model, prompt=prompt, max_tokens=12, **GREEDY)
    streamed = client.completions.create(model=triton_server.model, prompt=prompt, max_tokens=12, stream=True,
                                         **GREEDY)
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 12
    word = whole.choices[0].text.split()[1]
    cut = client.completions.create(model=triton_server.model, prompt=prompt, max_tokens=12, stop=[word], **GREEDY)
    assert cut.choices[0].finish_reason == "stop" and word not in cut.choices[0].text


SCHEMAS = {
    "nested": {"type": "object", "additionalProperties": False, "required": ["city", "country"],
               "properties": {"city": {"type": "string", "maxLength": 30},
                              "country": {"type": "object", "required": ["name", "continent"],
                                          "additionalProperties": False,
                                          "properties": {"name": {"type": "string", "maxLength": 30},
                                                         "continent": {"enum": ["Europe", "Asia", "Africa"]}}}}},
    "array": {"type": "object", "additionalProperties": False, "required": ["colours"],
              "properties": {"colours": {"type": "array", "minItems": 1, "maxItems": 3,
                                         "items": {"enum": ["red", "green", "blue", "yellow"]}}}},
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_responses_validate(client, triton_server, name):
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}
    r = client.chat.completions.create(model=triton_server.model, messages=FRANCE, max_tokens=120,
                                       response_format=fmt, **GREEDY)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMAS[name])
    streamed = client.chat.completions.create(model=triton_server.model, messages=FRANCE, max_tokens=120,
                                              response_format=fmt, stream=True, **GREEDY)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == r.choices[0].message.content


@pytest.mark.parametrize("bad,status,named", [
    ({"model": "no_such_model"}, 404, "no_such_model"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": 100_000}, 400, "max_tokens"),  # above the model's max_output_tokens: the model refuses it
    ({"temperature": 5}, 400, "temperature"),
    ({"n": 2}, 400, "n=1"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"content": "no role"}]}, 400, "role"),
    ({"logprobs": True}, 400, "logprobs"),
    ({"response_format": {"type": "regex", "regex": "(unclosed"}}, 400, "does not compile"),
    ({"response_format": {"type": "xml"}}, 400, "response_format"),
])
def test_bad_requests_get_openai_errors_and_the_next_one_succeeds(triton_server, bad, status, named):
    body = {"model": triton_server.model, "messages": FRANCE, "max_tokens": 4, **bad}
    for stream in (False, True):
        r = requests.post(f"{triton_server.openai_url}/chat/completions", json={**body, "stream": stream}, timeout=60)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert named in error["message"] and error["type"]
    r = requests.post(f"{triton_server.openai_url}/chat/completions", data="{not json", timeout=60,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()
    ok = requests.post(f"{triton_server.openai_url}/chat/completions", timeout=120,
                       json={"model": triton_server.model, "messages": FRANCE, "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]


def test_dropped_stream_cancels_the_request(client, triton_server):
    assert_dropped_stream_frees_blocks(triton_server, lambda: client.chat.completions.create(
        model=triton_server.model, messages=FRANCE, max_tokens=400, stream=True, extra_body={"ignore_eos": True},
        **GREEDY), timeout=30)
