"""An OpenAI-compatible HTTP API in front of `tritonserver`: `/v1/models`, `/v1/completions` and
`/v1/chat/completions`, streamed (server-sent events ending with `data: [DONE]`) or not.

A thin process (FastAPI): each request becomes one request to the Triton model over gRPC's bidirectional
stream (`tritonclient.grpc.aio`), whose responses carry the new text, the finish reason and the token
counts. A chat goes as the model's `messages` input, which the model renders with its own chat template.
Triton's refusals keep their meaning: INVALID_ARG -> 400, UNAVAILABLE (a full queue) -> 503, an unknown
model -> 404, all in OpenAI's error shape. A client that goes away cancels the gRPC stream, so the engine
frees the request's KV blocks. `response_format` (a JSON schema, any JSON object, or a regex) goes to the
model, whose engine enforces it (backend/structured.py). `alrkvd-serve` starts it beside `tritonserver`
(`--openai-port`, 9000).

    python -m server.openai_front --triton-grpc 127.0.0.1:8001 --port 9000
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any, Literal

import numpy as np
import tritonclient.grpc.aio as grpcclient
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from tritonclient.utils import InferenceServerException

OUTPUTS = ("text_output", "finish_reason", "num_input_tokens", "num_output_tokens")


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


# ---- requests: the fields this server honours; others are refused when set to what it cannot do -----------
class SamplingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None
    n: int = 1
    # structured output: {"type": "json_schema", "json_schema": {"schema": ...}}, {"type": "json_object"},
    # or {"type": "regex", "regex": ...} (this server's addition); enforced in the engine (backend/structured.py)
    response_format: dict | None = None


class CompletionRequest(SamplingRequest):
    prompt: str | list[str]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict] | None = None
    name: str | None = None


class ChatRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


ENGINE_EXTRAS = ("top_k", "ignore_eos", "stop_token_ids")
UNSUPPORTED = {"logprobs": (None, False), "top_logprobs": (None, 0), "tools": (None, []), "functions": (None, []),
               "echo": (None, False), "best_of": (None, 1), "suffix": (None, "")}


def sampling_parameters(body: SamplingRequest, max_tokens: int | None, default_max_tokens: int) -> dict:
    if body.n != 1:
        raise OpenAIError(400, "only n=1 is supported")
    for key, allowed in UNSUPPORTED.items():
        if (body.model_extra or {}).get(key) not in allowed:
            raise OpenAIError(400, f"'{key}' is not supported by this server")
    params = {"max_tokens": max_tokens or default_max_tokens}
    for key in ("temperature", "top_p", "seed"):
        if getattr(body, key) is not None:
            params[key] = getattr(body, key)
    if body.response_format is not None:  # checked and compiled by the model: a bad one is its 400
        params["response_format"] = body.response_format
    for key in ENGINE_EXTRAS:  # the engine's own sampling keys, as vLLM's server takes them (extra_body)
        if key in (body.model_extra or {}):
            params[key] = body.model_extra[key]
    if body.stop:
        params["stop"] = [body.stop] if isinstance(body.stop, str) else body.stop
    return params


# ---- Triton -----------------------------------------------------------------------------------------------
def _tensor(name: str, value) -> grpcclient.InferInput:
    if isinstance(value, bool):
        t = grpcclient.InferInput(name, [1], "BOOL")
        t.set_data_from_numpy(np.array([value], dtype=bool))
    else:
        t = grpcclient.InferInput(name, [1], "BYTES")
        t.set_data_from_numpy(np.array([value.encode("utf-8")], dtype=np.object_))
    return t


def _scalar(result, name: str):
    arr = result.as_numpy(name)
    if arr is None or arr.size == 0:
        return None
    value = arr.reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _status(error: InferenceServerException) -> OpenAIError:
    """Triton's error -> OpenAI's status: a full queue or a stopping server is 503, a refusal 400."""
    message = error.message() or str(error)
    status = str(error.status() or "")
    if "UNAVAILABLE" in status or "queue is full" in message or "shutting down" in message:
        return OpenAIError(503, message, "server_error")
    if "NOT_FOUND" in status or "unknown model" in message.lower():
        return OpenAIError(404, message, "not_found_error")
    if "INTERNAL" in status:
        return OpenAIError(500, message, "server_error")
    return OpenAIError(400, message)


class Triton:
    """The models Triton serves, and one generate request as a stream of (text, finish_reason, counts).
    `models`: the names the launcher loaded (Triton's repository index is an admin API, closed here)."""

    def __init__(self, url: str, models: list[str]):
        self.url, self.names = url, models
        self.client: grpcclient.InferenceServerClient | None = None
        self.default_max_tokens: dict[str, int] = {}

    async def models(self) -> list[str]:
        self.client = self.client or grpcclient.InferenceServerClient(self.url)
        return [m for m in self.names if await self.client.is_model_ready(m)]

    async def max_tokens_of(self, model: str) -> int:
        """A request's max_tokens when it sets none: the model's own ceiling (its `max_output_tokens`, else its
        `max_model_len` - 1), as OpenAI's API generates until the context ends."""
        if model not in self.default_max_tokens:
            if model not in await self.models():
                raise OpenAIError(404, f"The model '{model}' does not exist", "not_found_error")
            config = await self.client.get_model_config(model, as_json=True)
            params = {k: v.get("string_value", "") for k, v in config["config"].get("parameters", {}).items()}
            ceiling = params.get("max_output_tokens", "")
            if not ceiling.isdigit():
                ceiling = str(int(params["max_model_len"]) - 1) if params.get("max_model_len", "").isdigit() else "16"
            self.default_max_tokens[model] = int(ceiling)
        return self.default_max_tokens[model]

    async def generate(self, model: str, prompt_input: str, prompt, sampling: dict):
        """Yields (text delta, finish reason or None, input tokens, output tokens so far) per response."""
        self.client = self.client or grpcclient.InferenceServerClient(self.url)
        inputs = [_tensor(prompt_input, prompt if isinstance(prompt, str) else json.dumps(prompt)),
                  _tensor("stream", True), _tensor("sampling_parameters", json.dumps(sampling))]
        inputs += [_tensor(f"return_{name}", True) for name in OUTPUTS[1:]]
        done = asyncio.Event()

        async def requests():
            yield {"model_name": model, "inputs": inputs, "request_id": f"openai-{uuid.uuid4().hex[:16]}",
                   "outputs": [grpcclient.InferRequestedOutput(n) for n in OUTPUTS],
                   "enable_empty_final_response": True}
            await done.wait()  # the stream stays open until the final response

        stream = self.client.stream_infer(requests())
        output_tokens, final = 0, False
        try:
            async for result, error in stream:
                if error is not None:
                    final = True  # an error response is the request's last
                    raise _status(error)
                output_tokens += int(_scalar(result, "num_output_tokens") or 0)
                reason = _scalar(result, "finish_reason")
                final = result.get_response().parameters["triton_final_response"].bool_param
                yield (_scalar(result, "text_output") or "", None if reason in (None, "None") else reason,
                       int(_scalar(result, "num_input_tokens") or 0), output_tokens)
                if final:
                    return
        except InferenceServerException as e:
            raise _status(e) from None
        finally:
            done.set()  # the requests' iterator ends: the stream closes
            if not final:  # a client gone mid-stream: Triton cancels the request and the engine frees it.
                stream.cancel()  # (Not after the final response: Triton 2.51 then kept the model from unloading.)


# ---- the app ----------------------------------------------------------------------------------------------
def error_response(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}}, status)


def create_app(triton_url: str, models: list[str]) -> FastAPI:
    app = FastAPI(title="alrkvd OpenAI-compatible API")
    triton = Triton(triton_url, models)

    @app.exception_handler(OpenAIError)
    async def _openai_error(request, e: OpenAIError):
        return error_response(e.status, str(e), e.kind)

    @app.exception_handler(RequestValidationError)
    async def _bad_body(request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ())[1:])
        return error_response(400, f"{where}: {first.get('msg', 'invalid request')}".strip(": "),
                              "invalid_request_error")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "alrkvd"}
                                           for m in await triton.models()]}

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    async def respond(request: Request, body: SamplingRequest, kind: Literal["chat", "completion"]):
        if kind == "chat":
            prompt_input = "messages"
            prompt = [m.model_dump(exclude_none=True, exclude={"model_extra"}) for m in body.messages]
            limit = body.max_completion_tokens or body.max_tokens
        else:
            prompt_input = "text_input"
            if isinstance(body.prompt, list) and len(body.prompt) != 1:
                raise OpenAIError(400, "'prompt' must be a string or a list of one string")
            prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
            limit = body.max_tokens
        sampling = sampling_parameters(body, limit, await triton.max_tokens_of(body.model))
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        pieces = triton.generate(body.model, prompt_input, prompt, sampling)
        head = {"id": rid, "created": created, "model": body.model}

        def usage(n_in: int, n_out: int) -> dict:
            return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}

        if not body.stream:
            text, reason, n_in, n_out = "", None, 0, 0
            try:
                async for delta, reason, n_in, n_out in pieces:
                    text += delta
                    if await request.is_disconnected():
                        return None  # the generator's close cancels the Triton request
            finally:
                await pieces.aclose()
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
                      if kind == "chat" else {"index": 0, "text": text, "finish_reason": reason, "logprobs": None})
            return {**head, "object": "chat.completion" if kind == "chat" else "text_completion",
                    "choices": [choice], "usage": usage(n_in, n_out)}

        # streamed: the first response comes before the 200 is sent, so a refusal is still an error status
        try:
            first = await anext(pieces)
        except StopAsyncIteration:
            first = ("", "stop", 0, 0)
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        chunk_object = "chat.completion.chunk" if kind == "chat" else "text_completion"

        def chunk(delta: str, reason, role: bool = False) -> str:
            if kind == "chat":
                d = ({"role": "assistant"} if role else {}) | ({"content": delta} if delta or role else {})
                choice = {"index": 0, "delta": d, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": delta, "finish_reason": reason, "logprobs": None}
            return f"data: {json.dumps({**head, 'object': chunk_object, 'choices': [choice]})}\n\n"

        async def events():
            n_in = n_out = 0
            try:
                piece, first_piece = first, True
                while True:
                    delta, reason, n_in, n_out = piece
                    if delta or reason or first_piece:
                        yield chunk(delta, reason, role=first_piece)
                    first_piece = False
                    if reason is not None:
                        break
                    piece = await anext(pieces)
            except OpenAIError as e:  # after the 200: OpenAI's streams carry an error event
                yield f"data: {json.dumps({'error': {'message': str(e), 'type': e.kind}})}\n\n"
            except StopAsyncIteration:
                pass
            finally:
                await pieces.aclose()
            if include_usage:
                yield f"data: {json.dumps({**head, 'object': chunk_object, 'choices': [], 'usage': usage(n_in, n_out)})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await respond(request, body, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        return await respond(request, body, "chat")

    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--triton-grpc", default="127.0.0.1:8001", help="tritonserver's gRPC address")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--models", nargs="+", required=True, help="the models tritonserver serves")
    a = p.parse_args(argv)
    # a stop waits at most 5 s for open streams (a dropped one ends when its next chunk finds no client)
    uvicorn.run(create_app(a.triton_grpc, a.models), host=a.host, port=a.port, log_level="warning",
                timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
