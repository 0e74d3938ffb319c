"""Locust users that stream completions from Triton, one tenant per concrete user class.

Adapters own the connections (`GrpcStreamClient`: one tritonclient gRPC client and one
bidirectional stream; `SseClient`: one requests session on `generate_stream`); the abstract users
`GrpcLLMUser` / `HttpLLMUser` own one adapter each; `tenant_user_class()` binds a tenant to them.

Every request produces exactly one `events.request.fire` (request_type "grpc" | "sse", name = the
tenant, response_time = end-to-end ms, response_length = output tokens, exception = the failure),
live per-piece metric events (request_type "TTFT" | "ITL" | "TPOT", name = the tenant, response_time
in ms), and one `RequestRecord` line in requests.jsonl, the source of truth for the report.

Tenants may misbehave on purpose: `cancel` drops a stream after some tokens (`ClientCancel`, raised
from the piece callback, takes the adapters' own way out: the gRPC stream is cancelled, the HTTP
response closed), `invalid` makes every request a bad one (`tenants.make_invalid`). The request
event carries an exception only when the outcome is not the one the request was built for
(`metrics.expected`): a drop or a refused bad request is a success to Locust.

Importing this module monkey-patches the process for gevent (through Locust) and switches gRPC to
gevent mode: `grpc.experimental.gevent.init_gevent()` must run before any channel exists or streams
hang, so import it before creating any tritonclient.grpc client.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from dataclasses import dataclass, field
from typing import Callable

import gevent
import gevent.queue
from locust import User, task
from locust.user.users import LOCUST_STATE_STOPPING

from grpc.experimental import gevent as grpc_gevent

grpc_gevent.init_gevent()

import numpy as np  # noqa: E402
import requests  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
import urllib3  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from loadtest.metrics import (CANCELLED, CONNECT, EXPECT_CANCEL, EXPECT_INVALID, HTTP, STREAM_ERROR,  # noqa: E402
                              TIMEOUT, TRUNCATED, RequestRecord, derive, expected, outcome_of)
from loadtest.sse import SSEParser, decode_triton_event  # noqa: E402
from loadtest.tenants import Tenant, make_invalid  # noqa: E402

# Optional vLLM-backend inputs, sent only when the model declares them.
FLAG_INPUTS = ("exclude_input_in_output", "return_num_output_tokens", "return_num_input_tokens", "return_finish_reason")
ABORTED_REASONS = ("cancelled", "abort", "aborted")


class LLMRequestError(Exception):
    """A failed request, with its kind (metrics.FAILURE_KINDS)."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class ClientCancel(Exception):
    """Raised from a piece callback: the client drops the stream (a tenant's `cancel`). The adapters
    let it through their own error handling; leaving `generate` closes the HTTP response or cancels
    the gRPC stream, which is what a client going away does."""

    def __init__(self, tokens: int):
        super().__init__(f"the client dropped the stream after {tokens} token(s)")
        self.tokens = tokens


@dataclass(frozen=True)
class Piece:
    t: float  # time.perf_counter() at arrival
    tokens: int
    text: str = ""
    finish_reason: str | None = None
    num_input_tokens: int | None = None


@dataclass
class Outcome:
    finish_reason: str | None = None
    num_input_tokens: int | None = None
    tokens_from_server: bool = True


@dataclass(frozen=True)
class ModelInfo:
    inputs: dict[str, list[int]]  # name -> shape to send
    outputs: frozenset[str]


def _finish(o: Outcome, p: Piece) -> None:
    if p.finish_reason not in (None, "", "None", "null"):
        o.finish_reason = p.finish_reason
    if p.num_input_tokens is not None:
        o.num_input_tokens = p.num_input_tokens


def _check_end(o: Outcome, pieces: int, tokens: int) -> None:
    if o.finish_reason in ABORTED_REASONS:
        raise LLMRequestError(TRUNCATED, f"server ended the request early (finish_reason {o.finish_reason!r})")
    if tokens == 0 and o.finish_reason != "stop":
        raise LLMRequestError(TRUNCATED, f"stream ended after {pieces} piece(s) without any output token")


def _error_text(body: str) -> str:
    """The message of an error body: Triton answers a request refused at once with
    `data: {"error": ...}` (SSE framing) under a 4xx status, or with plain JSON."""
    events = SSEParser().feed(body.encode("utf-8") + b"\n\n")
    for text in [ev.data for ev in events] + [body]:
        try:
            return str(json.loads(text)["error"])[:500]
        except (ValueError, KeyError, TypeError):
            continue
    return body.strip()[:500]


def _sampling(max_tokens: int, sampling: dict) -> dict:
    return {**sampling, "max_tokens": int(max_tokens)}


class GrpcStreamClient:
    """One tritonclient gRPC client with one bidirectional stream; one request in flight at a time."""

    def __init__(self, url: str, request_timeout: float = 120.0):
        self.url = url
        self.request_timeout = request_timeout
        self._client = grpcclient.InferenceServerClient(url)
        self._queue: gevent.queue.Queue | None = None
        self._models: dict[str, ModelInfo] = {}

    def _model(self, name: str) -> ModelInfo:
        if name not in self._models:
            try:
                meta = self._client.get_model_metadata(name, as_json=True)
            except InferenceServerException as e:
                kind = CONNECT if "UNAVAILABLE" in str(e.status()) else HTTP
                raise LLMRequestError(kind, f"model metadata: {e.message()}") from None
            inputs = {i["name"]: [max(1, int(d)) for d in i["shape"]] for i in meta["inputs"]}
            self._models[name] = ModelInfo(inputs, frozenset(o["name"] for o in meta["outputs"]))
        return self._models[name]

    def _ensure_stream(self) -> gevent.queue.Queue:
        if self._queue is None:
            q: gevent.queue.Queue = gevent.queue.Queue()
            # Runs in the stream's reader greenlet: stamp the arrival time there, not when dequeued.
            self._client.start_stream(lambda result, error: q.put((time.perf_counter(), result, error)))
            self._queue = q
        return self._queue

    def _drop_stream(self, cancel: bool = True) -> None:
        """Close the stream; `cancel`: cancel what still runs on it (a request abandoned mid-way).

        A stream with nothing in flight is closed without cancelling: Triton 2.51's gRPC frontend can
        leak the call's state, its connection and a reference to the model (which then never unloads)
        when a stream is cancelled just after a final response (docs/LOADTEST.md, soak test).
        """
        self._queue = None
        try:
            self._client.stop_stream(cancel_requests=cancel)
        except Exception:  # noqa: BLE001 - the stream is being discarded
            pass

    def _inputs(self, info: ModelInfo, prompt: str, params: dict) -> tuple[list, dict | None]:
        def tensor(name, value, dtype):
            shape = info.inputs[name]
            t = grpcclient.InferInput(name, shape, dtype)
            arr = np.full(shape, value, dtype=np.object_ if dtype == "BYTES" else np.bool_)
            t.set_data_from_numpy(arr)
            return t

        inputs = [tensor("text_input", prompt.encode("utf-8"), "BYTES"), tensor("stream", True, "BOOL")]
        request_params = None
        if "sampling_parameters" in info.inputs:
            inputs.append(tensor("sampling_parameters", json.dumps(params).encode(), "BYTES"))
        else:
            request_params = params
        inputs += [tensor(n, True, "BOOL") for n in FLAG_INPUTS if n in info.inputs]
        return inputs, request_params

    def generate(self, model: str, prompt: str, max_tokens: int, sampling: dict, request_id: str,
                 on_piece: Callable[[Piece], None]) -> Outcome:
        info = self._model(model)
        inputs, request_params = self._inputs(info, prompt, _sampling(max_tokens, sampling))
        counted = "num_output_tokens" in info.outputs
        outcome = Outcome(tokens_from_server=counted)
        pieces = tokens = 0
        q = self._ensure_stream()
        deadline = time.perf_counter() + self.request_timeout
        try:
            self._client.async_stream_infer(model, inputs, request_id=request_id, parameters=request_params,
                                            enable_empty_final_response=True)
        except InferenceServerException as e:  # the stream died since the last request
            self._drop_stream()
            raise LLMRequestError(CONNECT, e.message()) from None
        done = False
        try:
            while True:
                try:
                    t, result, error = q.get(timeout=max(0.0, deadline - time.perf_counter()))
                except gevent.queue.Empty:
                    raise LLMRequestError(TIMEOUT, f"no final response after {self.request_timeout:g} s") from None
                if error is not None:
                    status = error.status()
                    if status is not None:  # the gRPC stream itself failed: it cannot be reused
                        self._drop_stream()
                        if pieces == 0:
                            raise LLMRequestError(CONNECT if "UNAVAILABLE" in status else HTTP,
                                                  f"{status}: {error.message()}")
                        raise LLMRequestError(TRUNCATED, f"stream broke after {pieces} piece(s): {status}")
                    done = True  # an error response ends the request; the stream itself is fine
                    raise LLMRequestError(STREAM_ERROR if pieces else HTTP, error.message() or "error response")
                response = result.get_response()
                if response.id and response.id != request_id:
                    continue  # a late answer to an earlier, abandoned request
                final = response.parameters["triton_final_response"].bool_param \
                    if "triton_final_response" in response.parameters else False
                done = final  # set first: a client cancel raised by on_piece must not cancel a finished request
                names = {o.name for o in response.outputs}
                if "text_output" in names or "num_output_tokens" in names:
                    text_arr = result.as_numpy("text_output") if "text_output" in names else None
                    text = b"".join(x for x in text_arr.ravel()).decode("utf-8", "replace") if text_arr is not None else ""
                    if counted and "num_output_tokens" in names:
                        n = int(result.as_numpy("num_output_tokens").sum())
                    else:
                        n = 1 if text else 0
                    fr = result.as_numpy("finish_reason") if "finish_reason" in names else None
                    nin = result.as_numpy("num_input_tokens") if "num_input_tokens" in names else None
                    piece = Piece(t, n, text, fr.ravel()[0].decode() if fr is not None and fr.size else None,
                                  int(nin.ravel()[0]) if nin is not None and nin.size else None)
                    pieces += 1
                    tokens += n
                    _finish(outcome, piece)
                    on_piece(piece)
                if final:
                    break
            _check_end(outcome, pieces, tokens)
            return outcome
        finally:
            if not done:  # timed out, failed or killed mid-request: abandon this stream
                self._drop_stream()

    def close(self) -> None:
        if self._queue is not None:
            self._drop_stream(cancel=False)  # nothing in flight: generate() cancels what it abandons
        self._client.close()


class SseClient:
    """One requests session streaming `POST /v2/models/<model>/generate_stream` (Server-Sent Events).

    requests is used rather than geventhttpclient, which bunches small events and delays the first.
    """

    def __init__(self, base_url: str, request_timeout: float = 120.0, connect_timeout: float = 10.0):
        self.base_url = base_url.rstrip("/")
        if "://" not in self.base_url:
            self.base_url = "http://" + self.base_url
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.session = requests.Session()
        self._models: dict[str, ModelInfo] = {}

    def _model(self, name: str) -> ModelInfo:
        if name not in self._models:
            try:
                r = self.session.get(f"{self.base_url}/v2/models/{name}", timeout=self.connect_timeout)
            except requests.RequestException as e:
                raise LLMRequestError(CONNECT, f"model metadata: {e}") from None
            if r.status_code != 200:
                raise LLMRequestError(HTTP, f"model metadata: HTTP {r.status_code}: {r.text[:200]}")
            meta = r.json()
            self._models[name] = ModelInfo({i["name"]: [1] for i in meta["inputs"]},
                                           frozenset(o["name"] for o in meta["outputs"]))
        return self._models[name]

    def _request(self, model: str, prompt: str, max_tokens: int, sampling: dict) -> tuple[str, dict, bool]:
        """(URL, JSON body, whether the events count tokens) of one streamed request."""
        info = self._model(model)
        # Declared inputs go as top-level keys (Triton's generate extension maps them onto inputs);
        # sampling goes in `sampling_parameters` when the model has it, else as request parameters.
        # No "id": the generate extension would pass it on as a (here unknown) sampling parameter.
        body: dict = {"text_input": prompt, "stream": True}
        body.update({n: True for n in FLAG_INPUTS if n in info.inputs})
        params = _sampling(max_tokens, sampling)
        if "sampling_parameters" in info.inputs:
            body["sampling_parameters"] = json.dumps(params)
        else:
            body["parameters"] = params
        return f"{self.base_url}/v2/models/{model}/generate_stream", body, "num_output_tokens" in info.outputs

    def _event(self, ev, t: float, counted: bool, pieces: int) -> Piece | None:
        """One event as a Piece (None: no piece, such as the end marker); LLMRequestError for an error event."""
        try:
            te = decode_triton_event(ev)
        except ValueError as e:
            raise LLMRequestError(STREAM_ERROR, str(e)) from None
        if te.error is not None:
            raise LLMRequestError(STREAM_ERROR if pieces else HTTP, te.error)
        n = te.num_output_tokens if counted and te.num_output_tokens is not None else (1 if te.text else 0)
        return Piece(t, n, te.text, te.finish_reason, te.num_input_tokens)

    def generate(self, model: str, prompt: str, max_tokens: int, sampling: dict, request_id: str,
                 on_piece: Callable[[Piece], None]) -> Outcome:
        url, body, counted = self._request(model, prompt, max_tokens, sampling)
        outcome = Outcome(tokens_from_server=counted)
        pieces = tokens = 0
        timer = gevent.Timeout(self.request_timeout)
        timer.start()
        resp = None
        try:
            try:
                resp = self.session.post(url, json=body, stream=True, timeout=(self.connect_timeout, self.request_timeout))
            except requests.exceptions.ReadTimeout as e:
                raise LLMRequestError(TIMEOUT, str(e)) from None
            except requests.RequestException as e:
                raise LLMRequestError(CONNECT, str(e)) from None
            if resp.status_code != 200:
                raise LLMRequestError(HTTP, f"HTTP {resp.status_code}: {_error_text(resp.text)}")
            parser = SSEParser()
            try:
                for chunk in resp.iter_content(chunk_size=None):
                    t = time.perf_counter()
                    for ev in parser.feed(chunk, t):
                        piece = self._event(ev, t, counted, pieces)
                        if piece is None:
                            continue
                        pieces += 1
                        tokens += piece.tokens
                        _finish(outcome, piece)
                        on_piece(piece)
            except requests.exceptions.ConnectionError as e:
                if e.args and isinstance(e.args[0], urllib3.exceptions.ReadTimeoutError):
                    raise LLMRequestError(TIMEOUT, str(e)) from None
                raise LLMRequestError(TRUNCATED, f"connection broke after {pieces} piece(s): {e}") from None
            except (requests.exceptions.ChunkedEncodingError, urllib3.exceptions.HTTPError) as e:
                raise LLMRequestError(TRUNCATED, f"connection broke after {pieces} piece(s): {e}") from None
            if parser.partial:
                raise LLMRequestError(TRUNCATED, f"stream ended inside an event after {pieces} piece(s)")
            _check_end(outcome, pieces, tokens)
            return outcome
        except gevent.Timeout as t:
            if t is not timer:
                raise
            raise LLMRequestError(TIMEOUT, f"no end of stream after {self.request_timeout:g} s") from None
        finally:
            timer.close()
            if resp is not None:
                resp.close()

    def close(self) -> None:
        self.session.close()


class OpenAIClient(SseClient):
    """Streamed `POST <base>/completions` of the OpenAI-compatible front (server/openai_front.py): the tenants'
    prompts and sampling as they go to Triton, so the same load runs through the front. Each event with text
    counts as one token (OpenAI's chunks carry no counts); the usage chunk gives the prompt's tokens."""

    def _request(self, model: str, prompt: str, max_tokens: int, sampling: dict) -> tuple[str, dict, bool]:
        body = {"model": model, "prompt": prompt, "stream": True, "stream_options": {"include_usage": True},
                **_sampling(max_tokens, sampling)}
        return f"{self.base_url}/completions", body, False

    def _event(self, ev, t: float, counted: bool, pieces: int) -> Piece | None:
        if ev.data == "[DONE]":
            return None
        try:
            d = json.loads(ev.data)
        except ValueError as e:
            raise LLMRequestError(STREAM_ERROR, f"not JSON: {e}") from None
        if "error" in d:
            raise LLMRequestError(STREAM_ERROR if pieces else HTTP, str(d["error"].get("message", d["error"])))
        if not d.get("choices"):  # the usage chunk
            usage = d.get("usage") or {}
            return Piece(t, 0, "", None, usage.get("prompt_tokens"))
        c = d["choices"][0]
        return Piece(t, 1 if c.get("text") else 0, c.get("text") or "", c.get("finish_reason"), None)


class ArrivalSchedule:
    """Poisson arrivals at `rate` per second: exponential gaps from a seeded generator, claimed in order."""

    def __init__(self, rate: float, seed: str, start: float):
        if rate <= 0:
            raise ValueError(f"arrival rate must be > 0, got {rate}")
        self.rate = rate
        self._rng = random.Random(seed)
        self._next = start

    def claim(self) -> float:
        self._next += self._rng.expovariate(self.rate)
        return self._next


@dataclass
class RunState:
    """Per-process state of one load test, shared by all users (set on `environment.loadtest`)."""

    grpc_url: str
    openai_url: str = ""  # the OpenAI-compatible front's base URL (".../v1"), for tenants on protocol openai
    request_timeout: float = 120.0
    warmup_s: float = 0.0
    worker_index: int = 0
    worker_count: int = 1
    arrival_rate: float = 0.0  # requests/s over the whole run, all tenants and processes; 0 = closed loop
    write: Callable[[dict], None] = lambda d: None
    start: float | None = None  # time.perf_counter() at test start
    counters: dict = field(default_factory=dict)
    schedules: dict = field(default_factory=dict)

    def begin(self) -> None:
        self.start = time.perf_counter()
        self.counters.clear()
        self.schedules.clear()

    def next_seq(self, tenant: str) -> int:
        # Interleave processes so the run as a whole sends prompts 0, 1, 2, ... of each tenant.
        c = self.counters.setdefault(tenant, itertools.count())
        return next(c) * self.worker_count + self.worker_index

    def schedule(self, tenant: Tenant, share: float, seed: int) -> ArrivalSchedule | None:
        if self.arrival_rate <= 0:
            return None
        if tenant.name not in self.schedules:
            rate = self.arrival_rate * share / self.worker_count
            self.schedules[tenant.name] = ArrivalSchedule(
                rate, f"{seed}/{tenant.name}/arrivals/{self.worker_index}", self.start or time.perf_counter())
        return self.schedules[tenant.name]


class LLMUser(User):
    """Sends one streamed completion per task and reports it; subclasses choose the adapter."""

    abstract = True
    tenant: Tenant
    arrival_share: float = 1.0  # this tenant's share of the Poisson arrival rate
    protocol = "grpc"

    def __init__(self, environment):
        super().__init__(environment)
        self.state: RunState = environment.loadtest
        self.client = self.make_client()
        self.session, self.turn = 0, None  # the session this user continues, its next turn

    def make_client(self):
        raise NotImplementedError

    def wait_time(self) -> float:
        """Closed loop: the tenant's think time. Poisson arrivals wait for their slot inside the task."""
        lo, hi = self.tenant.think_time_s
        if self.state.arrival_rate > 0 or hi <= 0:
            return 0.0
        return random.uniform(lo, hi)

    def on_stop(self):
        self.client.close()

    def _fire(self, request_type: str, value_ms: float, length: int = 0, exception=None, context=None) -> None:
        self.environment.events.request.fire(request_type=request_type, name=self.tenant.name,
                                             response_time=value_ms, response_length=length,
                                             exception=exception, context=context or {})

    def next_seq(self) -> int:
        """The tenant's next prompt. A session's turns (prompt k is turn k % turns of session k // turns: a
        conversation's, or questions about one document) go to one user in order, each sent after the last one's
        answer, as a person continues a chat: a turn finds its history where the server left it. Sessions are
        numbered across the run's users."""
        turns = self.tenant.prompt.turns
        if turns <= 1:
            return self.state.next_seq(self.tenant.name)
        if self.turn is None or self.turn == turns:
            self.session, self.turn = self.state.next_seq(f"{self.tenant.name}/sessions"), 0
        self.turn += 1
        return self.session * turns + self.turn - 1

    @task
    def generate(self):
        st, tn = self.state, self.tenant
        seq = self.next_seq()
        prompt, max_tokens, words = tn.request(seq)
        sampling, invalid = tn.sampling, tn.invalid_kind(seq)
        if invalid is not None:
            prompt, max_tokens, sampling = make_invalid(invalid, prompt, max_tokens, sampling)
        cancel_after = tn.cancel_after(seq, max_tokens)
        lag = None
        schedule = st.schedule(tn, self.arrival_share, tn.seed)
        if schedule is not None:
            at = schedule.claim()
            gevent.sleep(max(0.0, at - time.perf_counter()))
            if self._state == LOCUST_STATE_STOPPING:
                return  # the test ended while this arrival was pending
            lag = time.perf_counter() - at
        rid = f"{tn.name}-{st.worker_index}-{seq}"
        t0 = time.perf_counter()
        rec = RequestRecord(
            tenant=tn.name, protocol=self.protocol, model=tn.model, request_id=rid, t_start=time.time(),
            max_tokens=max_tokens, prompt_seq=seq, prompt_words=words, users=self.environment.runner.user_count
            if self.environment.runner else None, sched_lag=lag, worker=st.worker_index,
            warmup=st.start is not None and t0 - st.start < st.warmup_s,
            expect=EXPECT_INVALID if invalid else EXPECT_CANCEL if cancel_after else None, invalid_kind=invalid,
        )
        last = [None]

        def on_piece(p: Piece) -> None:
            rel = p.t - t0
            rec.piece_t.append(rel)
            rec.piece_tokens.append(p.tokens)
            if p.tokens > 0:
                if last[0] is None:
                    self._fire("TTFT", rel * 1000.0, p.tokens)
                else:
                    self._fire("ITL", (rel - last[0]) * 1000.0, p.tokens)
                last[0] = rel
            received = sum(rec.piece_tokens)
            if cancel_after is not None and received >= cancel_after:
                raise ClientCancel(received)

        exception = None
        try:
            out = self.client.generate(tn.model, prompt, max_tokens, sampling, rid, on_piece)
            rec.finish_reason, rec.num_input_tokens = out.finish_reason, out.num_input_tokens
            rec.tokens_from_server = out.tokens_from_server
        except LLMRequestError as e:
            rec.error_kind, rec.error, exception = e.kind, e.message, e
        except ClientCancel as e:
            rec.error_kind, rec.error = CANCELLED, str(e)
        rec.t_end = time.perf_counter() - t0
        if rec.piece_t:
            rec.t_end = max(rec.t_end, rec.piece_t[-1])
        tokens = sum(rec.piece_tokens)
        # Locust counts as failures the outcomes a request was not built for: a cancel or a refused
        # bad request is a success there, a bad request that was served is not.
        if expected(rec):
            exception = None
        elif exception is None:
            o = outcome_of(rec)
            exception = LLMRequestError(o, f"{rec.expect or 'an ordinary'} request ended {o}")
        self._fire({"http": "sse"}.get(self.protocol, self.protocol), rec.t_end * 1000.0, tokens, exception,
                   {"tenant": tn.name, "kind": rec.error_kind, "outcome": outcome_of(rec)})
        tpot = derive(rec).tpot
        if tpot is not None:
            self._fire("TPOT", tpot * 1000.0, tokens)
        st.write(rec.to_dict())
        if rec.error_kind == CONNECT:
            gevent.sleep(1.0)  # no server: retry once a second instead of spinning through failures


class GrpcLLMUser(LLMUser):
    abstract = True
    protocol = "grpc"

    def make_client(self):
        return GrpcStreamClient(self.state.grpc_url, self.state.request_timeout)


class HttpLLMUser(LLMUser):
    abstract = True
    protocol = "http"

    def make_client(self):
        return SseClient(self.host, self.state.request_timeout)


class OpenAILLMUser(LLMUser):
    abstract = True
    protocol = "openai"

    def make_client(self):
        return OpenAIClient(self.state.openai_url, self.state.request_timeout)


def tenant_user_class(tenant: Tenant, arrival_share: float = 1.0) -> type[LLMUser]:
    """A concrete Locust user class named after the tenant, weighted as the tenant says."""
    base = {"grpc": GrpcLLMUser, "http": HttpLLMUser, "openai": OpenAILLMUser}[tenant.protocol]
    attrs = {"tenant": tenant, "arrival_share": arrival_share, "__module__": __name__}
    if tenant.fixed_count:
        attrs["fixed_count"] = tenant.fixed_count
    else:
        attrs["weight"] = tenant.weight
    return type(tenant.name, (base,), attrs)
