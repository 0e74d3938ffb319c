"""Triton Python backend hosting the alrkvd engine (decoupled: one request, many responses).

Lifecycle only. Parsing and validation live in triton_request.py, config parameters ->
EngineArgs in engine_config.py, metrics in triton_metrics.py. Threads:
- Triton's, in `execute`: parse; a bad request is answered at once and never reaches the engine;
  a good one is scheduled on the event loop and `execute` returns None;
- the event loop (`alrkvd-loop`): one `_generate` coroutine per request consuming
  `AsyncEngine.generate`, plus `_watch_cancellations`; the engine steps on its own thread;
- the response thread: `InferenceResponseSender.send`, off the event loop;
- the metrics thread (triton_metrics.MetricsLogger).
"""

from __future__ import annotations

import asyncio
import json
import queue
import sys
import threading
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils

from engine_config import engine_args_from_config, server_options
from triton_metrics import MetricsLogger, TritonMetrics
from triton_request import INPUTS, OUTPUTS, GenerateRequest, RequestError, invalid, to_triton, unavailable

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
CANCEL_POLL_S = 0.1
DRAIN_TIMEOUT_S = 30.0


def _import_engine(model_dir: str):
    """backend.engine from the repository this model folder lives in (<repo>/model_repository/<m>)."""
    try:
        import backend.engine as engine
    except ImportError:
        sys.path.insert(0, str(Path(model_dir).resolve().parents[1]))
        import backend.engine as engine
    return engine


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        config = auto_complete_model_config.as_dict()
        have_in = {i["name"] for i in config["input"]}
        have_out = {o["name"] for o in config["output"]}
        for name, dtype, dims, optional in INPUTS:
            if name not in have_in:
                auto_complete_model_config.add_input(
                    {"name": name, "data_type": dtype, "dims": dims, "optional": optional})
        for name, dtype, dims in OUTPUTS:
            if name not in have_out:
                auto_complete_model_config.add_output({"name": name, "data_type": dtype, "dims": dims})
        auto_complete_model_config.set_model_transaction_policy(dict(decoupled=True))
        auto_complete_model_config.set_max_batch_size(0)  # the engine batches continuously
        return auto_complete_model_config

    # ---- initialize ------------------------------------------------------------------------
    def initialize(self, args):
        self.args = args
        self.logger = pb_utils.Logger
        self.model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(self.model_config):
            raise pb_utils.TritonModelException("the alrkvd model needs model_transaction_policy { decoupled: true }")
        self.engine_mod = _import_engine(args["model_repository"])
        self._init_engine_args()
        self._init_engine()
        self._setup_metrics()
        self._start_response_thread()
        self._start_event_loop()
        import torch

        graphs = getattr(self.engine, "graph_capture_s", 0.0)
        self.logger.log_info(f"[alrkvd] {args['model_name']} ready ({torch.get_num_threads()} torch threads"
                             + (f", decode CUDA graphs captured in {graphs:.1f} s" if graphs else "")
                             + f"): {self.engine_args}")

    def _init_engine_args(self):
        overrides = {}
        if self.args["model_instance_kind"] == "GPU":  # the GPU Triton assigned this instance
            overrides["device"] = f"cuda:{self.args['model_instance_device_id']}"
        self.engine_args = engine_args_from_config(
            self.model_config, self.args["model_repository"], self.engine_mod.EngineArgs, overrides)

    def _init_engine(self):
        threads = server_options(self.model_config)["torch_num_threads"]
        if threads > 0:
            import torch

            torch.set_num_threads(threads)
        self.engine = self.engine_mod.AsyncEngine(self.engine_args)  # loads weights, starts its thread

    def _setup_metrics(self):
        labels = {"model": self.args["model_name"], "version": self.args["model_version"]}
        self.metrics = MetricsLogger(TritonMetrics(labels), self.engine.stats)

    def _start_response_thread(self):
        self._response_queue: queue.Queue = queue.Queue()
        self._response_thread = threading.Thread(target=self._response_loop, name="alrkvd-responses",
                                                 daemon=True)
        self._response_thread.start()

    def _start_event_loop(self):
        self._lock = threading.Lock()
        self._inflight: dict[str, GenerateRequest] = {}
        self._stopping = False
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._run_loop, name="alrkvd-loop", daemon=True)
        self._loop_thread.start()
        asyncio.run_coroutine_threadsafe(self._watch_cancellations(), self._loop)

    def _run_loop(self):
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    # ---- execute -----------------------------------------------------------------------------
    def execute(self, requests):
        self.metrics.start()
        for request in requests:
            try:
                if self._stopping:
                    raise unavailable("the model is shutting down")
                req = GenerateRequest.parse(request, self.engine_mod.SamplingParams, self.engine.limits)
            except RequestError as e:
                self._refuse(request, e)
                continue
            except Exception as e:  # a parsing bug must not take the model down
                self._refuse(request, RequestError(f"request parsing failed: {e!r}", "INTERNAL"))
                continue
            with self._lock:
                self._inflight[req.request_id] = req
            asyncio.run_coroutine_threadsafe(self._generate(req), self._loop)
        return None

    def _refuse(self, request, error: RequestError):
        reason = "queue_full" if error.code == "UNAVAILABLE" else "invalid"
        self.metrics.record_failure(reason)
        self._response_queue.put((request.get_response_sender(),
                                  pb_utils.InferenceResponse(error=to_triton(error)), FINAL))

    # ---- the event loop ---------------------------------------------------------------------
    async def _generate(self, req: GenerateRequest):
        try:
            async for out in self.engine.generate(req.prompt, req.params, req.request_id,
                                                  priority=req.priority):
                self._on_output(req, out)
        except self.engine_mod.QueueFullError as e:
            self._fail(req, unavailable(str(e)), "queue_full")
        except ValueError as e:  # the engine's own door checks: prompt too long, ...
            self._fail(req, invalid(str(e)), "invalid")
        except Exception as e:
            self.logger.log_error(f"[alrkvd] request {req.request_id} failed: {e!r}")
            self._fail(req, RequestError(f"engine error: {e}", "INTERNAL"), "error")
        finally:
            if not req.final_sent:  # cancelled, or ended without a final output
                self._send(req, None, FINAL)
            with self._lock:
                self._inflight.pop(req.request_id, None)

    def _on_output(self, req: GenerateRequest, out):
        now = time.perf_counter()
        new = out.num_output_tokens - req.seen_tokens
        if new > 0:
            if req.first_token_time is None:
                req.first_token_time = now
                self.metrics.record_first_token(now - req.arrival, out.num_prompt_tokens)
                self.metrics.record_tokens(new, None)
            else:
                self.metrics.record_tokens(new, now - req.last_token_time)
            req.last_token_time = now
            req.seen_tokens = out.num_output_tokens
        if out.finished:
            self.metrics.record_finished(out.finish_reason, now - req.arrival)
        if req.cancelled:  # nothing more goes to a client that left; the final flag follows
            return
        if req.wants(out):
            self._send(req, req.create_response(out), FINAL if out.finished else 0)

    def _fail(self, req: GenerateRequest, error: RequestError, reason: str):
        self.metrics.record_failure(reason)
        self._send(req, pb_utils.InferenceResponse(error=to_triton(error)), FINAL)

    def _send(self, req: GenerateRequest, response, flags: int):
        if flags & FINAL:
            if req.final_sent:
                return
            req.final_sent = True
        self._response_queue.put((req.sender, response, flags))

    async def _watch_cancellations(self):
        """Client gone or gRPC cancel: abort in the engine, which frees the KV blocks at once."""
        while True:
            await asyncio.sleep(CANCEL_POLL_S)
            with self._lock:
                active = [r for r in self._inflight.values() if not r.cancelled]
            for req in active:
                try:
                    cancelled = req.sender.is_cancelled()
                except Exception:
                    cancelled = False
                if cancelled:
                    req.cancelled = True
                    self.engine.abort(req.request_id)

    # ---- the response thread -----------------------------------------------------------------
    def _response_loop(self):
        while True:
            item = self._response_queue.get()
            if item is None:
                return
            sender, response, flags = item
            try:
                if response is None:
                    sender.send(flags=flags)
                else:
                    sender.send(response, flags=flags)
            except Exception as e:  # e.g. the request was cancelled meanwhile
                self.logger.log_verbose(f"[alrkvd] send failed: {e!r}")

    # ---- finalize ----------------------------------------------------------------------------
    def finalize(self):
        """Refuse new requests, let in-flight ones finish (then abort stragglers), stop threads."""
        self._stopping = True
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while self._count_inflight() and time.monotonic() < deadline:
            time.sleep(0.1)
        with self._lock:
            leftover = list(self._inflight)
        for request_id in leftover:
            self.engine.abort(request_id)
        deadline = time.monotonic() + 5.0
        while self._count_inflight() and time.monotonic() < deadline:
            time.sleep(0.05)
        if leftover:
            self.logger.log_warn(f"[alrkvd] aborted {len(leftover)} request(s) still running at unload")
        self.engine.shutdown()
        try:
            asyncio.run_coroutine_threadsafe(self._cancel_tasks(), self._loop).result(timeout=5)
        except Exception as e:  # noqa: BLE001 - stopping anyway
            self.logger.log_warn(f"[alrkvd] event loop tasks did not stop: {e!r}")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=5)
        self._response_queue.put(None)
        self._response_thread.join(timeout=5)
        self.metrics.shutdown()
        self.logger.log_info(f"[alrkvd] {self.args['model_name']} finalized")

    async def _cancel_tasks(self):
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _count_inflight(self) -> int:
        with self._lock:
            return len(self._inflight)
