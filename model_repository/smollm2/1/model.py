"""Triton Python backend hosting the alrkvd engine (decoupled: one request, many responses).

Lifecycle only. Parsing and validation live in triton_request.py, config parameters ->
EngineArgs in engine_config.py, metrics in triton_metrics.py. Threads:
- Triton's, in `execute`: parse; a bad request is answered at once and never reaches the engine;
  a good one is scheduled on the event loop and `execute` returns None;
- the event loop (`alrkvd-loop`): one `_generate` coroutine per request consuming
  `AsyncEngine.generate`, plus `_watch`: cancellations, and the launcher's drain file; the engine steps
  on its own thread;
- the response thread: `InferenceResponseSender.send`, off the event loop;
- the metrics thread (triton_metrics.MetricsLogger).

Faults (README "Faults"): a request past its deadline ends with finish_reason "timeout"; a failed engine
step fails the requests it carried; if the engine thread itself dies, every request fails at once with
UNAVAILABLE and the model stops tritonserver (SIGTERM to its parent), the one way a Python model can make
Triton 2.51's health endpoints stop answering ready without model control. A stop announced in the drain
file ($ALRKVD_DRAIN_FILE, written by alrkvd-serve) refuses new requests and gives running ones the seconds
it names before ending them with UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
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
DRAIN_POLL_S = 0.5
DRAIN_TIMEOUT_S = 30.0  # at unload, when no drain file announced the stop
DRAIN_FILE_ENV = "ALRKVD_DRAIN_FILE"  # written by alrkvd-serve (server/serve.py) when it stops the server
TEST_FAULTS_ENV = "ALRKVD_TEST_FAULTS"  # "1": requests may carry the fault-injection test hook (never in production)


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
        self.allow_faults = os.environ.get(TEST_FAULTS_ENV) == "1"
        if self.allow_faults:
            self.logger.log_warn(f"[alrkvd] ${TEST_FAULTS_ENV}=1: requests may inject engine faults (test hook)")
        self._init_engine_args()
        self._init_engine()
        self._setup_metrics()
        self._start_response_thread()
        self._start_event_loop()
        import torch

        graphs = getattr(self.engine, "graph_capture_s", 0.0)
        warm_up = getattr(self.engine, "warm_up_s", 0.0)
        self.logger.log_info(f"[alrkvd] {args['model_name']} ready ({torch.get_num_threads()} torch threads"
                             + (f", decode CUDA graphs captured in {graphs:.1f} s" if graphs else "")
                             + (f", kernels warmed up in {warm_up:.1f} s" if warm_up else "")
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
        # loads weights, starts its thread
        self.engine = self.engine_mod.AsyncEngine(self.engine_args, on_death=self._on_engine_death)

    def _setup_metrics(self):
        labels = {"model": self.args["model_name"], "version": self.args["model_version"]}
        self.metrics = MetricsLogger(TritonMetrics(labels, self.engine.num_moe_layers), self.engine.stats,
                                     routing_fn=self.engine.routing_counts, steps_fn=self.engine.drain_steps)

    def _start_response_thread(self):
        self._response_queue: queue.Queue = queue.Queue()
        self._response_thread = threading.Thread(target=self._response_loop, name="alrkvd-responses",
                                                 daemon=True)
        self._response_thread.start()

    def _start_event_loop(self):
        self._lock = threading.Lock()
        self._inflight: dict[str, GenerateRequest] = {}
        self._stopping: str | None = None  # why new requests are refused
        self._drain_file = os.environ.get(DRAIN_FILE_ENV)
        self._drain_deadline: float | None = None  # time.monotonic() when still-running requests are ended
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._run_loop, name="alrkvd-loop", daemon=True)
        self._loop_thread.start()
        asyncio.run_coroutine_threadsafe(self._watch(), self._loop)

    def _run_loop(self):
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    # ---- execute -----------------------------------------------------------------------------
    def execute(self, requests):
        self.metrics.start()
        for request in requests:
            try:
                if self._stopping or self.engine.dead:
                    raise unavailable(self._stopping or self.engine.dead)
                req = GenerateRequest.parse(request, self.engine_mod.SamplingParams, self.engine.limits,
                                            allow_faults=self.allow_faults)
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
        reason = ("invalid" if error.code != "UNAVAILABLE" else
                  "shutdown" if self._stopping or self.engine.dead else "queue_full")
        self.metrics.record_failure(reason)
        self._response_queue.put((request.get_response_sender(),
                                  pb_utils.InferenceResponse(error=to_triton(error)), FINAL))

    # ---- the event loop ---------------------------------------------------------------------
    async def _generate(self, req: GenerateRequest):
        try:
            async for out in self.engine.generate(req.prompt, req.params, req.request_id, priority=req.priority,
                                                  deadline=req.deadline, fault=req.fault):
                self._on_output(req, out)
        except self.engine_mod.QueueFullError as e:
            self._fail(req, unavailable(str(e)), "queue_full")
        except self.engine_mod.EngineDeadError as e:
            self._fail(req, unavailable(str(e)), "error")
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
        if out.finished and not req.final_sent:  # not one already ended with an error (a stop's drain)
            self.metrics.record_finished(out.finish_reason, now - req.arrival)
        if req.cancelled:  # nothing more goes to a client that left (or was sent its error); the final flag follows
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

    async def _watch(self):
        """Client gone or gRPC cancel: abort in the engine, which frees the KV blocks at once. And the
        launcher's drain file: refuse new requests, end the running ones at the drain deadline."""
        next_drain_look = 0.0
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
            now = time.monotonic()
            if self._drain_file and self._drain_deadline is None and now >= next_drain_look:
                next_drain_look = now + DRAIN_POLL_S
                self._read_drain_file(now)
            if self._drain_deadline is not None and now >= self._drain_deadline and active:
                self._end_inflight("the server is shutting down: the request did not finish within the "
                                   "drain time")

    def _read_drain_file(self, now: float):
        try:
            with open(self._drain_file) as f:
                drain_s = float(f.read().strip() or 0)
        except FileNotFoundError:
            return
        except (OSError, ValueError):
            drain_s = 0.0
        self._stopping = "the server is shutting down"
        self._drain_deadline = now + drain_s
        self.logger.log_info(f"[alrkvd] stop announced: no new requests; {self._count_inflight()} running "
                             f"request(s) get {drain_s:g} s to finish")

    def _end_inflight(self, message: str):
        """On the event loop: send each running request an UNAVAILABLE error and abort it in the engine."""
        with self._lock:
            pending = [r for r in self._inflight.values() if not r.final_sent]
        for req in pending:
            req.cancelled = True  # its remaining outputs go nowhere
            self._fail(req, unavailable(f"{message} ({req.seen_tokens} tokens generated)"), "shutdown")
            self.engine.abort(req.request_id)
        if pending:
            self.logger.log_warn(f"[alrkvd] ended {len(pending)} request(s) still running: {message}")

    def _on_engine_death(self, reason: str):
        """The engine thread stopped (its requests have failed): stop tritonserver, so the health endpoints
        stop answering ready and whatever supervises the server restarts it (Triton 2.51 cannot mark one
        model not ready with model control off)."""
        self._stopping = reason
        parent = os.getppid()  # the stub's parent: tritonserver
        self.logger.log_error(f"[alrkvd] {self.args['model_name']}: {reason}; stopping tritonserver "
                              f"(pid {parent})")
        if parent > 1:
            os.kill(parent, signal.SIGTERM)

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
        """Refuse new requests, let in-flight ones finish (until the drain deadline, or DRAIN_TIMEOUT_S when
        no stop was announced), end the rest with an error, stop threads."""
        self._stopping = self._stopping or "the model is shutting down"
        deadline = self._drain_deadline or time.monotonic() + DRAIN_TIMEOUT_S
        while self._count_inflight() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._count_inflight():
            self._loop.call_soon_threadsafe(self._end_inflight, "the model is unloading: the request did not "
                                            "finish in time")
        deadline = time.monotonic() + 5.0
        while self._count_inflight() and time.monotonic() < deadline:
            time.sleep(0.05)
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
