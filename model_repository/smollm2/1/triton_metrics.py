"""Engine and request metrics on Triton's /metrics, recorded off the hot path.

Every `pb_utils.MetricFamily` is declared in `TritonMetrics`; `MetricsLogger.record_*` only
enqueue, and the logger's thread updates the metrics and refreshes the engine gauges
(running and waiting requests, KV cache use and compression) every `interval_s`.
"""

from __future__ import annotations

import queue
import threading
import time

import triton_python_backend_utils as pb_utils

# Seconds; vLLM's buckets, so dashboards built for the vLLM backend read these too.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0]
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0]
ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]  # tokens a step, vLLM's
STEP_BUCKETS = [0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12]  # seconds a step
FINISH_REASONS = ("stop", "length", "cancelled", "timeout")
# refused at the door (invalid, queue_full), failed in the engine (error), ended or refused by a stop (shutdown)
FAILURE_REASONS = ("invalid", "queue_full", "error", "shutdown")
# engine stats that are running totals -> the TritonMetrics counter that follows each
COUNTED_STATS = {"num_preemptions": "preemptions", "prefix_cache_hit_tokens": "prefix_cache_hits"}


EXPERT_GAUGES = {
    "expert_hit_rate": "Share of routed expert uses found in the device expert cache",
    "expert_prefetch_precision": "Share of prefetched experts that were then used",
    "expert_prefetch_recall": "Share of used experts that had been prefetched",
    "expert_bytes_streamed": "Expert bytes copied host to device since start",
    "expert_bytes_per_token": "Expert bytes copied host to device per token",
    "expert_stall_s_per_token": ("Seconds per token the compute stream waited for expert copies (when the host "
                                 "decides them; 0 when the device does, inside the step)"),
}


class TritonMetrics:
    """All metric families and this model's labelled metrics."""

    def __init__(self, labels: dict, num_moe_layers: int = 0):
        F = pb_utils.MetricFamily
        self.families = []

        def family(name, description, kind):
            f = F(name=name, description=description, kind=kind)
            self.families.append(f)
            return f

        def histogram(name, description, buckets):
            return family(name, description, F.HISTOGRAM).Metric(labels=labels, buckets=buckets)

        def metric(name, description, kind, **extra):
            return family(name, description, kind).Metric(labels={**labels, **extra})

        self.time_to_first_token = histogram(
            "alrkvd:time_to_first_token_seconds", "Time to first token, from arrival", TTFT_BUCKETS)
        self.time_per_output_token = histogram(
            "alrkvd:time_per_output_token_seconds", "Time per output token after the first", TPOT_BUCKETS)
        self.e2e_latency = histogram(
            "alrkvd:e2e_request_latency_seconds", "Arrival to last token of finished requests", E2E_BUCKETS)
        self.iteration_tokens = histogram(
            "alrkvd:iteration_tokens_total", "Tokens of each engine step: its decodes and prompt chunks",
            ITERATION_BUCKETS)
        self.iteration_duration = histogram(
            "alrkvd:iteration_duration_seconds", "Wall time of each engine step", STEP_BUCKETS)
        self.preemptions = metric(
            "alrkvd:num_preemptions_total", "Sequences preempted (their KV freed, recomputed later)", F.COUNTER)
        self.prefix_cache_hits = metric(
            "alrkvd:prefix_cache_hit_tokens_total",
            "Tokens taken from the prefix cache, not computed (a preempted request's generated ones too)", F.COUNTER)
        self.prompt_tokens = metric(
            "alrkvd:prompt_tokens_total", "Prompt tokens of admitted requests", F.COUNTER)
        self.generation_tokens = metric(
            "alrkvd:generation_tokens_total", "Generated tokens", F.COUNTER)
        success = family("alrkvd:request_success_total", "Finished requests by finish reason", F.COUNTER)
        self.request_success = {r: success.Metric(labels={**labels, "finished_reason": r})
                                for r in FINISH_REASONS}
        failure = family("alrkvd:request_failure_total", "Refused or failed requests by reason", F.COUNTER)
        self.request_failure = {r: failure.Metric(labels={**labels, "reason": r}) for r in FAILURE_REASONS}
        self.running = metric("alrkvd:num_requests_running", "Sequences the engine is running", F.GAUGE)
        self.waiting = metric("alrkvd:num_requests_waiting", "Requests waiting in the engine queue", F.GAUGE)
        self.kv_usage = metric("alrkvd:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1)", F.GAUGE)
        self.kv_blocks_used = metric("alrkvd:kv_cache_blocks_used", "KV blocks in use", F.GAUGE)
        self.kv_blocks_total = metric("alrkvd:kv_cache_blocks_total", "KV blocks in the cache", F.GAUGE)
        self.kv_bytes_used = metric("alrkvd:kv_cache_bytes_used", "KV bytes in use", F.GAUGE)
        self.kv_compression = metric(
            "alrkvd:kv_cache_compression_ratio", "KV bytes per token of fp16 over those of the cache format",
            F.GAUGE)
        # Expert streaming (backend/experts.py, graph_experts.py); they stay at 0 where every expert is resident.
        self.experts = {key: metric(f"alrkvd:{key}", description, F.GAUGE)
                        for key, description in EXPERT_GAUGES.items()}
        # Routing (MoE models): per MoE layer, the busiest expert's tokens over the mean since start (1 = even).
        if num_moe_layers:
            imbalance = family("alrkvd:moe_expert_load_imbalance",
                               "Busiest expert's routed tokens over the mean, per MoE layer, since start", F.GAUGE)
            self.moe_imbalance = [imbalance.Metric(labels={**labels, "layer": str(i)}) for i in range(num_moe_layers)]


    def close(self):
        """Drop every Metric, then every MetricFamily, while the stub is still whole.

        Left to interpreter exit, a MetricFamily's destructor runs after the stub's own and the
        stub segfaults (fixed in python_backend after 2.51).
        """
        for name in list(vars(self)):
            if name != "families":
                delattr(self, name)
        self.families.clear()


class MetricsLogger:
    """`record_*` enqueue; one thread applies the records and refreshes the engine gauges."""

    def __init__(self, metrics: TritonMetrics, stats_fn, interval_s: float = 0.5, routing_fn=None, steps_fn=None):
        self.metrics = metrics
        self.stats_fn = stats_fn
        self.routing_fn = routing_fn  # () -> [MoE layers, experts] routed-token counts, or None (dense)
        self.steps_fn = steps_fn  # () -> (tokens, seconds) of each engine step since the last call
        self.counted = dict.fromkeys(COUNTED_STATS, 0)  # the engine's running totals counted so far
        self.interval_s = interval_s
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="alrkvd-metrics", daemon=True)
        self._safely(("refresh",))  # on the caller's thread

    def start(self):
        """Start the thread: call once `initialize` has returned (the first `execute`).

        No metric IPC may run beside `initialize`: a metric update from another thread while
        the stub answers the load can leave the model never reported loaded (seen on 2.51).
        """
        if not self.thread.is_alive() and self.thread.ident is None:
            self.thread.start()

    # ---- producers (any thread) ------------------------------------------------------------
    def record_first_token(self, ttft_s: float, num_prompt_tokens: int):
        self.queue.put(("first", ttft_s, num_prompt_tokens))

    def record_tokens(self, n: int, gap_s: float | None):
        """n new tokens; `gap_s` since the previous tokens (None for the first ones)."""
        self.queue.put(("tokens", n, gap_s))

    def record_finished(self, reason: str | None, e2e_s: float):
        self.queue.put(("finished", reason, e2e_s))

    def record_failure(self, reason: str):
        self.queue.put(("failure", reason))

    def refresh(self):
        self.queue.put(("refresh",))

    def shutdown(self):
        if self.thread.ident is not None:
            self.queue.put(None)
            self.thread.join(timeout=5)
        self.metrics.close()

    # ---- the logger thread -----------------------------------------------------------------
    def _loop(self):
        next_refresh = time.monotonic()
        while True:
            try:
                item = self.queue.get(timeout=max(0.0, next_refresh - time.monotonic()))
            except queue.Empty:
                item = ("refresh",)
            if item is None:
                return
            if item[0] == "refresh" or time.monotonic() >= next_refresh:
                next_refresh = time.monotonic() + self.interval_s
                if item[0] != "refresh":
                    self._safely(("refresh",))
            self._safely(item)

    def _safely(self, item):
        try:
            self._apply(item)
        except Exception as e:  # a metric must never take the model down
            pb_utils.Logger.log_warn(f"alrkvd metrics: {item[0]} failed: {e!r}")

    def _apply(self, item):
        m = self.metrics
        kind = item[0]
        if kind == "first":
            m.time_to_first_token.observe(item[1])
            m.prompt_tokens.increment(item[2])
        elif kind == "tokens":
            n, gap = item[1], item[2]
            m.generation_tokens.increment(n)
            if gap is not None:  # spread the gap over the tokens it brought
                for _ in range(n):
                    m.time_per_output_token.observe(gap / n)
        elif kind == "finished":
            reason, e2e = item[1], item[2]
            if reason in m.request_success:
                m.request_success[reason].increment(1)
            if reason not in ("cancelled", "timeout"):  # ended early: not a latency of the server
                m.e2e_latency.observe(e2e)
            self._refresh()
        elif kind == "failure":
            m.request_failure[item[1]].increment(1)
        else:
            self._refresh()

    def _refresh(self):
        s = self.stats_fn()
        m = self.metrics
        m.running.set(s.get("running", 0))
        m.waiting.set(s.get("waiting", 0))
        used, total = s.get("kv_blocks_used", 0), s.get("kv_blocks_total", 0)
        m.kv_blocks_used.set(used)
        m.kv_blocks_total.set(total)
        m.kv_usage.set(used / total if total else 0.0)
        m.kv_bytes_used.set(s.get("kv_bytes_used", 0))
        m.kv_compression.set(s.get("compression", 1.0))
        for key, gauge in m.experts.items():
            gauge.set(s.get(key, 0.0))
        for tokens, seconds in self.steps_fn() if self.steps_fn is not None else ():
            m.iteration_tokens.observe(tokens)
            m.iteration_duration.observe(seconds)
        for key, counter in COUNTED_STATS.items():  # counters from the engine's running totals
            total = s.get(key, 0)
            if total > self.counted[key]:
                getattr(m, counter).increment(total - self.counted[key])
                self.counted[key] = total
        counts = self.routing_fn() if self.routing_fn is not None else None
        if counts is not None:
            for gauge, load in zip(m.moe_imbalance, counts):
                gauge.set(float(load.max() / load.mean()) if load.sum() > 0 else 0.0)
