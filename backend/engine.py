"""The engine: continuous batching over a paged KV cache, with streaming outputs.

`LLMEngine` is synchronous: `add_request`, `step`, `abort`. Each step the scheduler picks
decode tokens of running sequences first, then prefill chunks (long prompts are split over
several steps), admitting waiting requests while the KV budget allows; when blocks run out
mid-decode it preempts the newest running sequence (its KV is freed and recomputed later). A request
past its deadline ends at the next step, waiting or running (finish_reason "timeout").
`AsyncEngine` runs `LLMEngine` in its own thread and streams `RequestOutput`s to asyncio callers.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import math
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from backend.cuda_graphs import StepGraphs
from backend.copies import QueuedRead, queued_tensor
from backend.kv_cache import AttentionBatch, PagedKVCache, SeqKV
from backend.kv_formats import FORMATS
from backend.kv_presets import PRESETS, resolve_kv
from backend.loader import load_model, resolve_source
from backend.model import MoE
from backend.sampling import MAX_PROMPT_BYTES, RequestLimits, SamplingParams, draw, read_tokens, sample
from backend.step_cost import StepCost
from backend.structured import Grammars
from backend.tokenizer import IncrementalDetokenizer, Tokenizer


class QueueFullError(RuntimeError):
    """The engine holds `max_num_seqs + max_queue_size` requests: retry later (HTTP 503 / UNAVAILABLE)."""


class RequestFailedError(RuntimeError):
    """This request failed inside the engine (its sampling, or the step that carried it); others go on."""


class EngineDeadError(RuntimeError):
    """The engine thread stopped on an error outside a step: every request in it failed, new ones are refused."""


class InjectedFault(RuntimeError):
    """Raised by the fault-injection test hook (a request's `fault`): never in normal serving."""


# Test hook (README "Faults"): a request added with fault="step" makes the step that carries it raise (its
# requests fail, the engine goes on); fault="engine" makes the engine thread itself raise (the engine stops).
FAULTS = ("step", "engine")


# Routing statistics of SmolLM2 split into experts on WikiText-2 (benchmarks/moe_routing.py, 32 of 128 experts;
# journal 2026-12-04 9e): the busiest expert's load over the mean, and the share of a token's experts that the
# previous token chose. moe_routing="local" gives dummy models these, and PREGATING_RECALL: the share of a layer's
# experts that the next layer's router names from this layer's input (BENCHMARKS.md 8, "named from layer L-1").
LOCALITY = (2.16, 0.43)
PREGATING_RECALL = 0.40


@dataclass
class EngineArgs:
    model: str = "default"             # "default" (SmolLM2 GGUF), a .gguf file, or a HF folder
    load_format: str = "auto"          # "auto" or "dummy" (random weights from config.json)
    tokenizer: str | None = None       # defaults to the model source; "none": token ids only (benchmarks)
    device: str = "cpu"
    dtype: str = "auto"                # float32 on CPU, bfloat16 on CUDA
    weight_dtype: str = "auto"         # "float16" (CPU): linear weights in fp16, half the bytes per step
    kv_format: str = "fp16"            # a format (backend/kv_formats/) or a preset (backend/kv_presets.py)
    kv_options: dict = field(default_factory=dict)
    kv_budget_bytes: int = 256 << 20
    max_model_len: int | None = None   # defaults to the model's context length
    max_output_tokens: int | None = None  # a request's max_tokens at most this; None: max_model_len - 1
    max_num_seqs: int = 16             # running sequences
    max_num_batched_tokens: int = 512  # tokens per step (decode + prefill chunks)
    max_step_ms: float | None = None   # stall-free batching: prefill chunks sized from measured step costs so a
                                       # step beside running decodes lasts about this (backend/step_cost.py)
    max_step_ratio: float | None = None  # the same, relative: such a step lasts about this many decode-only
                                         # steps of the running batch (with max_step_ms too: the smaller)
    max_queue_size: int = 256          # waiting requests (beyond max_num_seqs running) before QueueFullError
    scheduling_policy: str = "fcfs"    # "fcfs" or "priority" (lower value first)
    attention_backend: str = "auto"    # "auto": Triton decode kernels on CUDA; "torch": reference path; "triton":
                                       # the kernels on any device (CPU: Triton's interpreter, tests)
    enable_prefix_caching: bool = False  # a request whose first tokens fill blocks cached from an earlier one
                                         # (a chat's history) takes those blocks, not computing them (kv_cache.py)
    enforce_eager: bool = False        # CUDA: no CUDA graphs (backend/cuda_graphs.py)
    cuda_graph_max_tokens: int = 512   # CUDA: steps with prompt chunks of up to this many tokens replay graphs
                                       # too (fp16/full KV), and prompt chunks beside running decodes are cut to
                                       # fit, so no stream waits for an eager step; 0: decode steps only. 512
                                       # over 256: prompts in half the steps (BENCHMARKS.md, Decisions)
    piecewise_graphs: bool = False     # CUDA, ALR-KVD and KIVI: those chunks not cut at their block's end; a step
                                       # with one across a block that no run of window slots holds, or (ALR-KVD)
                                       # whose prompt rows would read a long compressed history, replays graph
                                       # pieces, attention eager between (backend/cuda_graphs.py). Off: every step
                                       # one graph, chunks cut at their block's end or (ALR-KVD, two a step) across
                                       # blocks in runs of window slots, long histories eager (under Locust,
                                       # inter-token p99 2.5 against 4.4x its p50 in pieces, block-cut;
                                       # BENCHMARKS.md Decisions)
    layered_prefill: int = 0           # beside running decodes, prompt chunks go through the layers in this many
                                       # groups, a group a step, instead of all at once: a MoE chunk of any size reads
                                       # nearly every expert of each layer it passes, so a step that carries whole
                                       # chunks stalls every stream (layered prefill, arXiv 2510.08055); 0 or 1: off.
                                       # MoE: only beside few enough decodes (`layering_max_decodes`). On CUDA a
                                       # graph per group (fp16-style caches; ALR-KVD's chunks in runs of window
                                       # slots): served, 8 users' ITL p99/p50 1.50-2.05x against 2.30-2.35x
                                       # (BENCHMARKS.md Decisions)
    seed: int = 0
    expert_budget_bytes: int | None = None  # device bytes for routed experts, streamed from host; None: all resident
    expert_prefetch: int = 1           # MoE layers ahead whose experts are prefetched (pre-gating); 0: on demand only
    expert_policy: str = "lru"         # expert cache eviction: "lru" or "lfu"
    expert_decisions: str = "auto"     # "device": which experts to copy is decided on the device, so CUDA graphs
                                       # hold the step (backend/graph_experts.py); "host": per MoE layer on the
                                       # host (eager steps); "auto": device on CUDA unless enforce_eager
    moe_routing: str = "learned"       # "seeded": experts from a hash of each token's position and row, the same
                                       # in every run and arm (dummy-weight benchmarks; Transformer.seed_routing);
                                       # "local": the same with a trained router's load skew and reuse (LOCALITY)
    overlap_outputs: bool | None = None  # AsyncEngine: a step's outputs go to their streams once the next step is
                                         # queued on the device, so the server's Python for each token (responses,
                                         # sends) runs while the GPU computes instead of contending for the GIL
                                         # in the host's part of the next step (served, 32 users, H100: 1,128 ->
                                         # 1,235 tok/s; BENCHMARKS.md Decisions). None: on CUDA (on the CPU the
                                         # next forward is the host's own work: each token would wait a step)
    async_scheduling: bool = False     # while every running sequence decodes (nothing waiting, no grammar), the next
                                       # step is queued with the tokens the last one drew on the device, before the
                                       # host reads them: the host's part of a step (reading and sending the tokens,
                                       # the next step's metadata and launch) runs while the GPU computes (vLLM V1's
                                       # async scheduling). A sequence that stops on a sampled token (EOS, a stop
                                       # string) has one row computed for nothing


@dataclass
class RequestOutput:
    request_id: str
    text_delta: str
    text: str
    token_ids: list[int]
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    error: str | None = None           # set when finish_reason is "error"


@dataclass
class PendingStep:
    """A step whose forward and sampling are queued on the device: its decoding sequences, their logits, the tokens
    drawn from them and where the host reads them (a copy queued to the host where more work is queued behind it: the
    next step, `async_scheduling`, or a layered step's group of layers; else the tokens; None where the batch's draw
    raised: they sample row by row when read)."""
    seqs: list
    batch: AttentionBatch
    logits: torch.Tensor
    tokens: torch.Tensor | None
    read: QueuedRead | torch.Tensor | None


@dataclass
class LayeredChunks:
    """Prompt chunks part-way through the layers (`EngineArgs.layered_prefill`), (sequence, tokens) each in the order
    of their rows: their residual stream after `next_layer` layers. Their KV is written layer by layer; the
    sequences' caches take the chunks (commit) after the last layer."""
    chunks: list
    next_layer: int = 0
    hidden: torch.Tensor | None = None
    residual: torch.Tensor | None = None

    def drop(self, gone) -> None:
        """Forget the chunks of sequences in `gone` (finished or preempted: their KV is freed) and their rows."""
        if not any(seq in gone for seq, _ in self.chunks):
            return
        starts = itertools.accumulate((n for _, n in self.chunks), initial=0)
        keep = [row for (seq, n), start in zip(self.chunks, starts) if seq not in gone
                for row in range(start, start + n)]
        self.chunks = [(seq, n) for seq, n in self.chunks if seq not in gone]
        if self.hidden is not None:
            rows = torch.tensor(keep, device=self.hidden.device, dtype=torch.long)
            self.hidden = self.hidden[rows]
            self.residual = None if self.residual is None else self.residual[rows]


class Sequence:
    def __init__(self, request_id, prompt_ids, params, detok, priority, max_len, device):
        self.request_id, self.prompt_ids, self.params, self.priority = request_id, prompt_ids, params, priority
        self.all_ids: list[int] = list(prompt_ids)  # the prompt, then each sampled token: one list, read by every
        # step without a copy (a long context is not rebuilt per step and sequence)
        self.kv = SeqKV()
        self.detok = detok
        self.text, self.sent = "", 0
        self.arrival = time.monotonic()
        self.max_len = max_len
        self.finish_reason: str | None = None
        # on the logits' device: the sampler draws a seeded row's noise there (a CPU generator cannot draw on CUDA)
        self.generator = torch.Generator(device).manual_seed(params.seed) if params.seed is not None else None
        self.matcher = None  # the response_format's grammar state (backend/structured.py)

    @property
    def output_ids(self) -> list[int]:
        return self.all_ids[len(self.prompt_ids):]

    @property
    def num_output(self) -> int:
        return len(self.all_ids) - len(self.prompt_ids)

    @property
    def num_pending(self) -> int:
        """Tokens whose KV is not cached yet (prompt chunks, the last sampled token, or all after preemption)."""
        return len(self.all_ids) - self.kv.num_tokens


def layering_max_decodes(moe: MoE) -> int:
    """The most decodes beside which layered prefill goes through the layers a group a step: while a decode step of B
    tokens reads under half the experts a prompt's step reads (1 - (1 - k/E)^B of them under uniform routing), a
    step that carries a whole chunk reads over 2x a decode step's bytes. Beside more decodes the whole chunk costs
    less than that, and layering only delays first tokens: Qwen3-30B-A3B (k 8 of E 128) layers beside up to 10;
    in the engine at 32 users the mixed steps were 1.30x the decode steps' p50 and layering took the first token
    from 57 to 230 ms (H100, journal 2026-12-07 32a)."""
    kept = 1 - moe.top_k / moe.gate.out_features  # the share of experts a token does not route to
    return max(1, math.ceil(math.log(0.5) / math.log(kept)) - 1) if 0 < kept < 1 else 1 << 30


class LLMEngine:
    def __init__(self, args: EngineArgs):
        if args.kv_format not in FORMATS and args.kv_format not in PRESETS:  # fail before the (slow) model load
            raise ValueError(f"unknown kv format {args.kv_format!r}; choose a format {sorted(FORMATS)} "
                             f"or a preset {sorted(PRESETS)}")
        if args.moe_routing not in ("learned", "seeded", "local"):
            raise ValueError(f"moe_routing must be 'learned', 'seeded' or 'local', not {args.moe_routing!r}")
        if args.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', not {args.scheduling_policy!r}")
        if args.max_num_seqs > args.max_num_batched_tokens:
            raise ValueError(f"max_num_seqs ({args.max_num_seqs}) must not exceed max_num_batched_tokens "
                             f"({args.max_num_batched_tokens}): every running decode goes in every step")
        self.args = args
        self.on_launch = lambda: None  # once a step's forward is queued on the device, before the host waits for it
        if args.max_step_ratio is not None and args.max_step_ratio <= 1:
            raise ValueError(f"max_step_ratio must exceed 1 (a step with prompt tokens outlasts a decode step), "
                             f"not {args.max_step_ratio}")
        if args.layered_prefill < 0:
            raise ValueError(f"layered_prefill must be 0 (off) or a number of layer groups, not {args.layered_prefill}")
        if args.layered_prefill > 1 and args.expert_budget_bytes is not None:  # (its prefetch follows the layers)
            raise ValueError("layered_prefill does not go with streamed experts (expert_budget_bytes) yet")
        stall_free = args.max_step_ms is not None or args.max_step_ratio is not None
        # (its first steps compile kernels: not what later steps cost)
        self.step_cost = StepCost(args.max_step_ms, args.max_step_ratio, warmup_steps=8) if stall_free else None
        torch.manual_seed(args.seed)
        if args.expert_decisions not in ("auto", "device", "host"):
            raise ValueError(f"expert_decisions must be 'auto', 'device' or 'host', not {args.expert_decisions!r}")
        decisions = args.expert_decisions
        if decisions == "auto":
            decisions = "device" if str(args.device).startswith("cuda") and not args.enforce_eager else "host"
        self.model = load_model(args.model, args.load_format, args.device, args.dtype, args.seed,
                                args.expert_budget_bytes, args.expert_prefetch, args.expert_policy,
                                args.weight_dtype, decisions)
        self.cfg = self.model.cfg
        # "none" (like vLLM's skip_tokenizer_init): prompts are token ids and outputs carry no text
        self.tokenizer = None if args.tokenizer == "none" else Tokenizer.load(resolve_source(args.tokenizer or args.model))
        self.max_model_len = args.max_model_len or self.cfg.max_position_embeddings
        self.model.setup_rotary(self.max_model_len)
        self.moe_layers = [m for m in self.model.modules() if isinstance(m, MoE)]
        self.layering_max_decodes = layering_max_decodes(self.moe_layers[0]) if self.moe_layers else 1 << 30
        if args.moe_routing != "learned":
            local = args.moe_routing == "local"
            self.model.seed_routing(args.seed, locality=LOCALITY if local else None,
                                    pregating_recall=PREGATING_RECALL if local else None)
        most_tokens = max(args.max_num_batched_tokens, self.max_model_len)  # a step, or a `score` chunk
        ones = torch.ones(most_tokens * self.cfg.num_experts_per_tok, dtype=torch.float64,
                          device=args.device) if self.moe_layers else None
        for m in self.moe_layers:  # before any graph capture: the graphs add to these tensors
            m.routed_tokens = torch.zeros(m.gate.out_features, dtype=torch.float64, device=args.device)
            m.routed_ones = ones
        self.stop_ids = set(self.tokenizer.stop_token_ids if self.tokenizer else ()) | set(self.cfg.eos_token_id)
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.requests: dict[str, Sequence] = {}
        self.deadlines: dict[str, float] = {}  # request id -> its deadline, for the requests that have one
        self.faults: dict[str, str] = {}       # request id -> injected fault (test hook, FAULTS)
        self.ids = itertools.count()
        self.num_preemptions = 0
        self.prefix_cache_hit_tokens = 0  # tokens admitted requests took from the prefix cache (a re-admitted one's
        # generated tokens too: what it did not compute again)
        self.scheduled: list[Sequence] = []  # the sequences of the step under way
        self.plan: list[tuple[Sequence, int]] = []  # the last step's (sequence, tokens)
        self.layered: LayeredChunks | None = None  # the prompt chunks going through the layers a group a step
        self.layered_plan: tuple[list, int, int] | None = None  # the last step's: (its chunks, first, last layer)
        self.pending: PendingStep | None = None  # a decode step queued before its tokens were read (async_scheduling)
        self.reset_cache(args.kv_format, args.kv_options, args.kv_budget_bytes, args.max_num_seqs)

    def reset_cache(self, kv_format: str, kv_options: dict, budget_bytes: int, max_num_seqs: int):
        """A new, empty paged cache of another format (or preset) or size (the quality harness swaps formats so)."""
        if self.has_unfinished():
            raise RuntimeError("cannot replace the KV cache while requests are running")
        a = self.args
        kv_format, kv_options = resolve_kv(kv_format, kv_options)
        a.kv_format, a.kv_options, a.kv_budget_bytes = kv_format, kv_options, budget_bytes
        self.cache = None  # free the old pool before allocating the new one
        graph_tokens = min(a.cuda_graph_max_tokens, a.max_num_batched_tokens)
        # rows the decode kernels take in one launch: a mixed graph's, or a layered group's graph (a whole chunk)
        layer_rows = StepGraphs.layer_rows(graph_tokens, self.layer_groups(), a.max_num_batched_tokens)
        self.cache = PagedKVCache(self.cfg, self.model.rotary, kv_format, a.kv_options, budget_bytes, max_num_seqs,
                                  self.model.embed_tokens.weight.dtype, a.device, a.attention_backend,
                                  max_query_rows=max(graph_tokens, layer_rows),
                                  prefix_caching=a.enable_prefix_caching)
        self.model.rotate_values(self.cache.value_rotation)  # the values this cache stores: V, or V R
        self.graphs = None  # graphs hold the old cache's tensors: captured anew for this one
        if not a.enforce_eager and StepGraphs.supported(self.model, self.cache):
            self.graphs = StepGraphs(self.model, self.cache, max_num_seqs, self.max_model_len, graph_tokens,
                                     piecewise=a.piecewise_graphs, layer_groups=self.layer_groups(),
                                     layer_tokens=a.max_num_batched_tokens)

    # ---- requests -----------------------------------------------------------------------
    def tokenize(self, prompt) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this engine has no tokenizer (tokenizer='none'): pass prompt_ids")
        if isinstance(prompt, list):  # chat messages
            prompt = self.tokenizer.apply_chat_template(prompt)
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("prompt must be a non-empty string or a list of chat messages")
        return self.tokenizer.encode(prompt)

    def add_request(self, prompt, params: SamplingParams, request_id: str | None = None,
                    priority: int = 0, prompt_ids: list[int] | None = None, deadline: float | None = None,
                    fault: str | None = None) -> str:
        """`deadline`: a time.monotonic() value; the request ends with finish_reason "timeout" at the first
        step after it, waiting or running, and frees its KV blocks. `fault`: the test hook (FAULTS)."""
        request_id = request_id if request_id is not None else str(next(self.ids))
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, not {fault!r}")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already running")
        ids = prompt_ids if prompt_ids is not None else self.tokenize(prompt)
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens; this model allows at most {self.max_model_len - 1}")
        blocks = -(-(len(ids) + 1) // self.cache.block_size)
        if blocks > self.cache.allocator.num_blocks:
            raise ValueError(f"prompt needs {blocks} KV blocks; the cache holds {self.cache.allocator.num_blocks}")
        params.validate(self.limits)
        seq = Sequence(request_id, ids, params, IncrementalDetokenizer(self.tokenizer, ids) if self.tokenizer else None, priority,
                       self.max_model_len, self.args.device)
        if params.response_format is not None:
            seq.matcher = self.grammars.matcher(params.response_format)  # ValueError: it does not compile
        self.requests[request_id] = seq
        if deadline is not None:
            self.deadlines[request_id] = deadline
        if fault is not None:
            self.faults[request_id] = fault
        self.waiting.append(seq)
        return request_id

    @functools.cached_property
    def grammars(self) -> Grammars:
        """The response_format compiler (backend/structured.py), made on the first request that has one."""
        if self.tokenizer is None:
            raise ValueError("response_format needs a tokenizer (this engine has tokenizer='none')")
        return Grammars(self.tokenizer, self.cfg.vocab_size, self.stop_ids)

    @property
    def limits(self) -> RequestLimits:
        out = self.max_model_len - 1
        prompt_bytes = MAX_PROMPT_BYTES if self.tokenizer is None else \
            min(MAX_PROMPT_BYTES, (self.max_model_len - 1) * self.tokenizer.max_token_bytes)
        return RequestLimits(self.max_model_len, self.cfg.vocab_size,
                             min(out, self.args.max_output_tokens) if self.args.max_output_tokens else out,
                             prompt_bytes)

    def abort(self, request_id: str) -> RequestOutput | None:
        seq = self.requests.get(request_id)
        if seq is None:
            return None
        seq.finish_reason = "cancelled"
        return self._finish(seq)

    def expire(self, now: float | None = None) -> list[RequestOutput]:
        """End the requests whose deadline has passed (finish_reason "timeout"), freeing their KV blocks."""
        now = time.monotonic() if now is None else now
        out = []
        for request_id, deadline in list(self.deadlines.items()):
            if deadline <= now:
                seq = self.requests[request_id]
                seq.finish_reason = "timeout"
                out.append(self._finish(seq))
        return out

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.pending)

    # ---- scheduling ---------------------------------------------------------------------
    def _order(self, seqs):
        if self.args.scheduling_policy == "priority":
            return sorted(seqs, key=lambda s: (s.priority, s.arrival))
        return seqs

    def _preempt(self, seq: Sequence):
        """Free a running sequence's KV; it waits at the front and recomputes later."""
        self.cache.free(seq.kv)
        self.running.remove(seq)
        self.waiting.insert(0, seq)
        self.num_preemptions += 1
        if self.layered is not None:
            self.layered.drop([seq])

    def schedule(self) -> list[tuple[Sequence, int]]:
        """The step's plan, (sequence, tokens): every running decode first, so no stream waits for a
        prompt; then prompt chunks (running ones, then newly admitted) within the token budget. With
        `max_step_ms` or `max_step_ratio`, the budget is what the measured step costs allow and the shortest
        prompts go first. With `layered_prefill`, beside decodes the prompt chunks go through the layers a group a
        step (`self.layered`, not in the plan), and no other prompt starts until they are through."""
        self.running = self._order(self.running)
        scheduled: list[tuple[Sequence, int]] = []
        if self.layered is not None:  # without the finished (aborted, timed out, failed)
            self.layered.drop([seq for seq, _ in self.layered.chunks if seq not in self.running])
        self.cache.release_runs(keep=[seq.kv for seq, _ in self.layered.chunks] if self.layered is not None else [])
        for seq in [s for s in self.running if s.num_pending == 1]:
            if seq not in self.running:  # preempted below to make room for an earlier one
                continue
            while not self.cache.can_allocate(seq.kv, 1):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq in self.running:
                self.cache.allocate(seq.kv, 1)
                scheduled.append((seq, 1))
        if self.layered is not None and self.layered.chunks:
            return scheduled
        self.layered, layered_chunks = None, []
        layering = self.args.layered_prefill > 1 and 0 < len(scheduled) <= self.layering_max_decodes
        budget = self.args.max_num_batched_tokens - len(scheduled)
        # a layered step carries a group of its chunks' layers: the chunks may be that many steps' tokens
        layered_budget = self.args.max_num_batched_tokens
        mixed_graphs = self.graphs is not None and self.graphs.max_tokens > 0
        in_graph = bool(scheduled) and mixed_graphs
        # without decodes a step's chunks are not cut to a graph, but one that fits a run of window slots takes it,
        # so that a step a mixed graph holds replays it (a chunk across blocks with no run attends eagerly)
        prompts_alone = not scheduled and mixed_graphs
        if in_graph:  # beside decodes: a step a graph holds
            budget = max(0, min(budget, self.graphs.max_tokens - len(scheduled)))
        if self.step_cost is not None:
            step_budget = self.step_cost.prefill_budget(len(scheduled), self.args.max_num_batched_tokens)
            budget = min(budget, step_budget)
            if layering:
                layered_budget = min(layered_budget, max(1, step_budget) * self.args.layered_prefill)
        self.waiting = self._order(self.waiting)
        candidates = [s for s in self.running if s.num_pending > 1] + self.waiting
        if self.step_cost is not None:  # shortest prompt first: a chat's few tokens never queue behind a document
            candidates.sort(key=lambda s: s.num_pending)
        for seq in candidates:
            if (layered_budget if layering else budget) == 0:
                break
            cached = 0 if seq in self.running else self.cache.match_prefix(seq.kv, seq.all_ids)
            layered = layering and seq.num_pending > 1 and (
                self.graphs is None or self.graphs.layers_read_little(seq.kv, min(seq.num_pending, layered_budget)))
            n = min(seq.num_pending, layered_budget if layered else budget)
            if n == 0:  # (layering: a one-token prompt past the step's budget)
                if seq not in self.running:
                    self.cache.free(seq.kv)  # (the cached blocks it took)
                continue
            # rows a graph reads beside decodes (a mixed step's, or a layered chunk's where its groups are graphs): a
            # windowed format's chunk ends at its block's end or within a run of window slots (piecewise: a mixed
            # step's chunks across blocks, eager)
            graph_rows = in_graph and (not layered or bool(self.graphs.layer_groups))
            if graph_rows and (layered or not self.graphs.piecewise):
                n = min(n, self.cache.mixed_chunk_limit(seq.kv))
            if seq in self.running:
                while not self.cache.can_allocate(seq.kv, n):  # preempt the newest, never a scheduled decode
                    victim = next(s for s in reversed(self.running)
                                  if all(s is not t for t, _ in scheduled + layered_chunks))
                    self._preempt(victim)
                    if victim is seq:
                        break
                if seq not in self.running:
                    continue
            else:
                # admit only with a block to spare per running sequence, so decodes do not thrash
                if (len(self.running) >= self.args.max_num_seqs
                        or not self.cache.can_allocate(seq.kv, n, reserve=len(self.running))):
                    self.cache.free(seq.kv)  # (the cached blocks it took)
                    if self.step_cost is None:
                        break  # first come, first served: nobody overtakes the head of the queue
                    continue
                self.waiting.remove(seq)
                self.running.append(seq)
                self.prefix_cache_hit_tokens += cached
            self.cache.allocate(seq.kv, n)
            if graph_rows or prompts_alone:
                self.cache.take_run(seq.kv, n)  # (a chunk across its block's end: a run of window slots)
            if layered:  # after the decodes' step, a group of layers a step
                layered_chunks.append((seq, n))
                layered_budget -= n
                continue
            scheduled.append((seq, n))
            budget -= n
        if layered_chunks:
            self.layered = LayeredChunks(layered_chunks)
        return scheduled

    # ---- one step -----------------------------------------------------------------------
    def on_device(self):
        """The engine's CUDA device made current while it runs: Triton launches its kernels on the current
        device, not on their tensors' one, so an engine on cuda:N (a Triton model instance on GPU N) would
        otherwise launch them on GPU 0."""
        return torch.cuda.device(self.args.device) if str(self.args.device).startswith("cuda") \
            else contextlib.nullcontext()

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        self.plan = []
        if self.deadlines:
            expired = self.expire()
            if expired:  # a step of its own, so a failure of the next one cannot lose these outputs
                return expired
        with self.on_device():
            return self._step()

    def _step(self) -> list[RequestOutput]:
        start = time.perf_counter()
        self.scheduled, self.layered_plan = [], None
        if self.pending is not None:  # a decode step queued before the last one's tokens were read
            step, self.pending = self.pending, None
            self.scheduled, self.plan = step.seqs, [(seq, 1) for seq in step.seqs]
            outputs = self._go_on(step, queued=True)
            if self.step_cost is not None:
                self.step_cost.observe(self.step_tokens(), (time.perf_counter() - start) * 1e3)
            return outputs
        scheduled = self.schedule()
        self.scheduled = [seq for seq, _ in scheduled + (self.layered.chunks if self.layered else [])]
        self.plan = scheduled
        if not self.scheduled:
            return []
        if self.faults and any(self.faults.get(seq.request_id) == "step" for seq in self.scheduled):
            raise InjectedFault("injected fault in an engine step (test hook)")
        step = self._launch(scheduled) if scheduled else None
        # a layered step's group of layers is queued before its decodes' tokens are read, so that the device runs
        # it while the host takes them (read the other way, the device waited 2.6 ms of a 14.9-ms layered step for
        # the host, H100, 8 users, journal 2026-12-08 43c)
        first_tokens = self._run_layers(decodes=bool(scheduled)) if self.layered is not None else []
        outputs = (self._go_on(step) if step is not None else []) + first_tokens
        if self.step_cost is not None:  # the step's tokens have synchronised: its wall time is its cost
            self.step_cost.observe(self.step_tokens(), (time.perf_counter() - start) * 1e3)
        return outputs

    def step_tokens(self) -> int:
        """The last step's tokens, layered chunks' counted by the share of the layers they went through."""
        tokens = sum(n for _, n in self.plan)
        if self.layered_plan is not None:
            chunks, first, last = self.layered_plan
            tokens += round(sum(n for _, n in chunks) * (last - first) / self.cfg.num_layers)
        return tokens

    @staticmethod
    def _rows(chunks: list[tuple[Sequence, int]]) -> tuple[list[int], list[int], list[int]]:
        """The flat batch of (sequence, tokens) chunks after each one's cached tokens: tokens, positions and each
        chunk's last row."""
        tokens, positions, last = [], [], []
        for seq, n in chunks:
            start = seq.kv.num_tokens
            tokens += seq.all_ids[start:start + n]
            positions += range(start, start + n)
            last.append(len(tokens) - 1)
        return tokens, positions, last

    def _launch(self, scheduled: list[tuple[Sequence, int]]) -> PendingStep | None:
        """The step's forward queued on the device, its KV committed and the next tokens of the sequences that sample
        drawn (None when none does: chunks of longer prompts)."""
        device = self.args.device
        tokens, positions, last = self._rows(scheduled)
        batch = AttentionBatch([s.kv for s, _ in scheduled], [n for _, n in scheduled])
        hidden = self.graphs.run(tokens, positions, batch) if self.graphs is not None else None
        if hidden is None:
            hidden = self.model(torch.tensor(tokens, device=device), torch.tensor(positions, device=device),
                                self.cache, batch)
        self.on_launch()
        ready, rows = self._commit(batch, scheduled, last)
        if not ready:
            return None
        # a decode step's rows are its first ones: a slice, where indexing by a list would copy the list to the
        # device and so wait for the step's forward before the logits could be queued behind it
        return self._draw(ready, hidden[:len(rows)] if rows[-1] == len(rows) - 1 else hidden[rows], batch)

    def _commit(self, batch: AttentionBatch, chunks: list[tuple[Sequence, int]], last: list[int]):
        """The chunks' KV into their sequences' caches (and the prefix cache); the sequences whose whole context is
        now cached (a prompt's last chunk, or a decode), which sample next, and the rows of their last tokens."""
        self.cache.commit(batch)
        for seq, _ in chunks:
            self.cache.cache_blocks(seq.kv, seq.all_ids)
        ready = [(seq, i) for (seq, _), i in zip(chunks, last) if seq.num_pending == 0]
        return [seq for seq, _ in ready], [i for _, i in ready]

    def layer_groups(self) -> list[tuple[int, int]]:
        """The (first, last) layers of each step of layered prefill beside decodes (`EngineArgs.layered_prefill`)."""
        L, G = self.cfg.num_layers, self.args.layered_prefill
        return [(first, min(L, first + -(-L // G))) for first in range(0, L, -(-L // G))] if G > 1 else []

    def _run_layers(self, decodes: bool) -> list[RequestOutput]:
        """The layered chunks' next group of layers (all that are left in a step without decodes); after the last,
        the sequences' caches take the chunks and those at their prompt's end sample their first token."""
        layered, L, device = self.layered, self.cfg.num_layers, self.args.device
        first = layered.next_layer
        tokens, positions, ends = self._rows(layered.chunks)
        if first == 0:
            layered.hidden = self.model.embed_tokens(torch.tensor(tokens, device=device))
        groups = [(f, last) for f, last in self.layer_groups() if f >= first]
        batch = AttentionBatch([seq.kv for seq, _ in layered.chunks], [n for _, n in layered.chunks])
        out = None  # each group as a graph where one holds it (beside decodes one group, else all that are left)
        if self.graphs is not None and self.graphs.layer_groups:
            for f, last in groups[:1] if decodes else groups:
                out = self.graphs.run_layers(layered.hidden, layered.residual, positions, batch, f, last)
                if out is None:  # (then at the first group: the rows are the same in each)
                    break
                layered.hidden, layered.residual = out
        if out is None:
            last = groups[0][1] if decodes else L
            out = self.model.forward_layers(layered.hidden, layered.residual, torch.tensor(positions, device=device),
                                            self.cache, batch, first, last)
            layered.hidden, layered.residual = out
        self.on_launch()
        self.layered_plan, layered.next_layer = (list(layered.chunks), first, last), last
        if last < L:
            return []
        self.layered = None
        ready, rows = self._commit(batch, layered.chunks, ends)
        if not ready:  # chunks of longer prompts
            return []
        return self._go_on(self._draw(ready, self.model.final_norm(layered.hidden[rows], layered.residual[rows]),
                                      batch))

    def _draw(self, seqs: list[Sequence], hidden: torch.Tensor, batch: AttentionBatch) -> PendingStep:
        """Each sequence's next token drawn, queued on the device, from its last position's final hidden state (a
        row of `hidden`)."""
        logits = self.model.logits(hidden)
        matchers = [seq.matcher for seq in seqs]
        if any(m is not None for m in matchers):
            self.grammars.apply(logits, matchers)
        try:
            tokens = draw(logits, [s.params for s in seqs], [s.generator for s in seqs])
        except Exception:  # noqa: BLE001 - the rows sample one by one when read (`sample`), each error its own
            tokens = None
        # queued, the read must not wait behind the next step, nor a layered step's decodes behind its group of layers;
        # otherwise a plain read is cheaper (B=1 4.89-4.90 ms a step against 5.09-5.19 through QueuedRead, H100,
        # journal 2026-12-07 41b)
        queued = self.args.async_scheduling or self.layered is not None
        read = QueuedRead(tokens) if tokens is not None and queued else tokens
        return PendingStep(seqs, batch, logits, tokens, read)

    def _go_on(self, step: PendingStep, queued: bool = False) -> list[RequestOutput]:
        """The step's tokens read and appended to their sequences (`queued`: a step queued ahead by the last one).
        With `async_scheduling` the next step is queued before that (`_launch_ahead`), and its KV committed after:
        the prefix cache hashes a block with its tokens."""
        ahead = self._launch_ahead(step) if self.args.async_scheduling else None
        if queued and ahead is None:  # `step` went on the device in the last step: the hook runs before the wait,
            self.on_launch()            # else the outputs it hands over would wait for `step` too
        outputs = self._take(step)
        if ahead is not None:
            self.cache.commit(ahead.batch)
            for seq in ahead.seqs:
                if seq.finish_reason is None:  # (one that stopped on the token it took: its KV is freed)
                    self.cache.cache_blocks(seq.kv, seq.all_ids)
            self.pending = ahead
        return outputs

    def _take(self, step: PendingStep) -> list[RequestOutput]:
        """The step's tokens on the host (the wait on the device), each appended to its sequence or failing it alone;
        nothing for the sequences that finished since the step was queued (aborted, timed out, stopped)."""
        seqs = step.seqs
        ids = (read_tokens(step.read) if step.read is not None
               else sample(step.logits, [s.params for s in seqs], [s.generator for s in seqs]))
        return [self._fail(seq, f"sampling failed: {tok!r}") if isinstance(tok, Exception) else self._append(seq, tok)
                for seq, tok in zip(seqs, ids) if seq.finish_reason is None]

    def _launch_ahead(self, step: PendingStep) -> PendingStep | None:
        """The next decode step of `step`'s sequences, queued before `step`'s tokens are read: its input tokens are
        the ones `step` drew, on the device. Only where that is the whole next step: every running sequence took a
        token in `step`, nothing waits, no grammar (its mask needs the token), and each has room for its next token;
        those that stop by their length with the token they took are left out. Nor where the next step closes a block
        whose compression waits on the host for the device (ALR-KVD's basis solve), which, with a step queued, is that
        step too; the outputs then came a step late (ALR-KVD served with queued steps, H100, journal 2026-12-07 42a)."""
        seqs = step.seqs
        if (step.tokens is None or self.waiting or self.layered is not None or len(seqs) != len(self.running)
                or any(s.matcher is not None or not self.cache.can_allocate(s.kv, 1) for s in seqs)):
            return None
        keep = [i for i, s in enumerate(seqs)
                if s.num_output + 1 < s.params.max_tokens and len(s.all_ids) + 1 < s.max_len]
        graphs = self.graphs
        if not keep or any(self.cache.closing_waits_on_host(seqs[i].kv) for i in keep) or (
                graphs is not None and graphs.capture and len(keep) <= graphs.max_batch
                and ("decode", len(keep)) not in graphs.graphs):  # (no capture behind a queued step)
            return None
        ahead = [seqs[i] for i in keep]
        tokens = step.tokens
        if len(keep) < len(seqs):
            tokens = tokens[queued_tensor(torch.tensor(keep), tokens.device)]
        for seq in ahead:
            self.cache.allocate(seq.kv, 1)
        positions = [seq.kv.num_tokens for seq in ahead]
        batch = AttentionBatch([seq.kv for seq in ahead], [1] * len(ahead))
        hidden = graphs.run(tokens, positions, batch) if graphs is not None else None
        if hidden is None:
            hidden = self.model(tokens, torch.tensor(positions, device=self.args.device), self.cache, batch)
        self.on_launch()
        return self._draw(ahead, hidden[:len(ahead)], batch)

    def fail_step(self, error: Exception) -> list[RequestOutput]:
        """The step under way raised: fail the requests it carried (their KV may be half written) and
        keep the others, which wait and run in later steps."""
        # a failure before the step's plan existed cannot be attributed: it fails every request
        failed = [seq for seq in self.scheduled or self.running + self.waiting if seq.request_id in self.requests]
        self.scheduled, self.pending = [], None
        return [self._fail(seq, f"engine step failed: {error!r}") for seq in failed]

    def _fail(self, seq: Sequence, error: str) -> RequestOutput:
        seq.finish_reason = "error"
        out = self._finish(seq)
        out.error = error
        return out

    def _append(self, seq: Sequence, token: int) -> RequestOutput:
        if seq.matcher is not None and not seq.matcher.consume_token(token):
            return self._fail(seq, f"the response_format's grammar refused token {token}: {seq.matcher.get_error()}")
        seq.all_ids.append(token)
        p = seq.params
        if token in p.stop_token_ids or (token in self.stop_ids and not p.ignore_eos):
            seq.finish_reason = "stop"
        else:
            seq.text += seq.detok.step(token) if seq.detok else ""
            for s in p.stop:
                idx = seq.text.find(s, max(0, len(seq.text) - len(s) - 32))
                if idx >= 0:
                    seq.text = seq.text[:idx]
                    seq.finish_reason = "stop"
                    break
            if seq.matcher is not None and seq.matcher.is_stopped():  # the grammar is complete with this token
                seq.finish_reason = "stop"
        if seq.finish_reason is None and (seq.num_output >= p.max_tokens or len(seq.all_ids) >= seq.max_len):
            seq.finish_reason = "length"
        if seq.finish_reason is not None:
            return self._finish(seq, [token])
        return self._output(seq, [token])

    def _output(self, seq: Sequence, new_ids: list[int]) -> RequestOutput:
        # hold back text that could still turn into a stop string
        hold = max((len(s) for s in seq.params.stop), default=1) - 1 if seq.finish_reason is None else 0
        upto = max(seq.sent, len(seq.text) - hold)
        delta, seq.sent = seq.text[seq.sent:upto], upto
        return RequestOutput(seq.request_id, delta, seq.text[:upto], seq.output_ids, new_ids,
                             seq.finish_reason is not None, seq.finish_reason,
                             len(seq.prompt_ids), seq.num_output)

    def _finish(self, seq: Sequence, new_ids: list[int] = ()) -> RequestOutput:
        self.cache.free(seq.kv)
        for q in (self.running, self.waiting):
            if seq in q:
                q.remove(seq)
        del self.requests[seq.request_id]
        self.deadlines.pop(seq.request_id, None)
        self.faults.pop(seq.request_id, None)
        return self._output(seq, list(new_ids))

    # ---- offline use ----------------------------------------------------------------------
    def generate(self, prompts: list, params: SamplingParams) -> list[RequestOutput]:
        ids = [self.add_request(p, SamplingParams(**vars(params))) for p in prompts]
        final: dict[str, RequestOutput] = {}
        while self.has_unfinished():
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[i] for i in ids]

    @torch.inference_mode()
    def score(self, token_ids: list[int], chunk_size: int = 128, on_chunk=None) -> torch.Tensor:
        """Teacher-forced logits [N, V] of a token sequence fed in chunks through the real cache:
        each chunk attends to itself in full precision and to the cached (compressed) past.
        `on_chunk(seq_kv)` runs after each chunk (memory accounting). Frees its blocks at the end."""
        kv = SeqKV()
        logits = []
        with self.on_device():
            try:
                for start in range(0, len(token_ids), chunk_size):
                    chunk = token_ids[start:start + chunk_size]
                    self.cache.allocate(kv, len(chunk))
                    batch = AttentionBatch([kv], [len(chunk)])
                    dev = self.args.device
                    hidden = self.model(torch.tensor(chunk, device=dev),
                                        torch.arange(start, start + len(chunk), device=dev), self.cache, batch)
                    self.cache.commit(batch)
                    logits.append(self.model.logits(hidden).cpu())
                    if on_chunk is not None:
                        on_chunk(kv)
            finally:
                self.cache.free(kv)
        return torch.cat(logits)

    def warm_up(self) -> float:
        """A throwaway load, once before the first request, so that what a first request would compile compiles
        now (as vLLM runs a step at start; graphs capture none of it): a prompt alone, then a prompt in chunks
        beside its decode, the first across blocks, the second over a cached history (the history's rebuild,
        flash attention, the compression of the blocks filled, the decode kernel of eager steps). Without it the
        first requests waited seconds: 11.5 s for the first graph-pieced step (H100, 2026-12-05). Leaves nothing
        behind: its requests finish, and the step-time curve and routing counts start empty. First, every GEMM
        row count and fused-MoE variant an eager step can meet (`Transformer.warm_up_kernels`). Returns the seconds
        taken (that alone where the cache is too small to hold the load)."""
        start = time.perf_counter()
        self.model.warm_up_kernels(self.args.max_num_batched_tokens)
        bs = self.cache.block_size
        beside = self.args.max_num_batched_tokens - 1  # prompt tokens a step takes beside one decode
        if self.graphs is not None and self.graphs.max_tokens:
            beside = min(beside, self.graphs.max_tokens - 1)
        if beside < 1:  # (a step of one token: nothing rides beside a decode)
            return time.perf_counter() - start
        decoding = 2 * bs + 1  # two closed blocks to decode over
        capacity = (self.cache.allocator.num_free - 4) * bs
        prompt = min(beside + 2 * bs, capacity - decoding, self.max_model_len - 3)
        # (while the prompt's chunks run, as the output limit allows)
        decode_steps = min(-(-prompt // beside) + 4, self.limits.max_output_tokens, self.max_model_len - decoding - 1)
        if prompt < 2 * bs or decode_steps < 2 or self.has_unfinished():
            return time.perf_counter() - start
        step_cost, self.step_cost = self.step_cost, None  # (chunks as large as the step allows)
        try:
            self.add_request(None, SamplingParams(max_tokens=decode_steps, temperature=0, ignore_eos=True),
                             "warm-up-decode", prompt_ids=[1] * decoding)
            self.step()
            self.add_request(None, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True), "warm-up-prompt",
                             prompt_ids=[2] * prompt)
            while self.has_unfinished():
                self.step()
        finally:
            self.step_cost = step_cost
            for request_id in ("warm-up-decode", "warm-up-prompt"):
                self.abort(request_id)
        self.reset_routing_counts()
        return time.perf_counter() - start

    def routing_counts(self) -> torch.Tensor | None:
        """[MoE layers, experts]: tokens routed to each expert since start (None for a dense model), read behind every
        step queued on the current stream (another thread reads `AsyncEngine.routing_counts`)."""
        return torch.stack([m.routed_tokens for m in self.moe_layers]).cpu() if self.moe_layers else None

    def reset_routing_counts(self):
        for m in self.moe_layers:
            m.routed_tokens.zero_()

    def stats(self) -> dict:
        tokens = sum(s.kv.num_tokens for s in self.running)
        cache = self.cache.stats()
        used = cache["kv_bytes_used"]
        nominal = self.cache.block_bytes / self.cache.block_size
        return {
            "running": len(self.running),
            "waiting": len(self.waiting),
            "num_preemptions": self.num_preemptions,
            "prefix_cache_hit_tokens": self.prefix_cache_hit_tokens,
            **cache,
            "kv_tokens": tokens,
            "kv_bytes_per_token": used / tokens if tokens else nominal,
            "compression": cache["baseline_bytes_per_token"] / (used / tokens if tokens else nominal),
            **(self.model.expert_cache.stats() if hasattr(self.model, "expert_cache") else {}),
        }


class AsyncEngine:
    """Runs an `LLMEngine` on its own thread; `generate` streams to any asyncio loop. On CUDA a step's outputs go
    to their streams once the next step is queued on the device (`EngineArgs.overlap_outputs`).

    A step that raises fails the requests it carried and the thread goes on. An error outside a step ends
    the thread: every stream gets `EngineDeadError` at once, later calls are refused with it, and
    `on_death(reason)` runs (the Triton model stops the server, so its health endpoints say so)."""

    def __init__(self, args: EngineArgs, on_death=None):
        self.engine = LLMEngine(args)
        self.args = args
        self.graph_capture_s = self.engine.graphs.capture_all() if self.engine.graphs is not None else 0.0
        # (on CUDA, where the first steps would compile kernels; the CPU path compiles none)
        self.warm_up_s = self.engine.warm_up() if str(args.device).startswith("cuda") else 0.0
        self.engine.reset_routing_counts()  # the captures' throwaway tokens are not traffic
        self.num_moe_layers = len(self.engine.moe_layers)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wakeup = threading.Event()
        self.streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.lock = threading.Lock()
        # every accepted request until its stream ends: running, waiting, or still in the inbox
        self.capacity = args.max_num_seqs + args.max_queue_size
        self._stats = self.engine.stats()
        self.steps: collections.deque = collections.deque(maxlen=4096)  # each step's (tokens, seconds), until drained
        overlap = args.overlap_outputs
        self.overlap_outputs = str(args.device).startswith("cuda") if overlap is None else overlap
        self.held: list[RequestOutput] = []  # the last step's outputs, until the next step is on the device
        if self.overlap_outputs:
            self.engine.on_launch = self._deliver
        self.routing = self.engine.routing_counts()  # the counts last published for other threads (`_publish`)
        self.routing_read: QueuedRead | None = None  # the next, on its way to the host
        self.routing_due = 0.0  # time.monotonic() when the next is queued
        self.stopped = False
        self.dead: str | None = None  # why the engine thread stopped, once it has
        self.on_death = on_death
        self.thread = threading.Thread(target=self._run, name="alrkvd-engine", daemon=True)
        self.thread.start()

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    @property
    def limits(self) -> RequestLimits:
        return self.engine.limits

    async def generate(self, prompt, params: SamplingParams, request_id: str, priority: int = 0,
                       deadline: float | None = None, fault: str | None = None):
        """`deadline` (time.monotonic()) and `fault` (test hook): see `LLMEngine.add_request`."""
        prompt_ids = self.engine.tokenize(prompt)  # ValueError before anything is queued
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        with self.lock:
            if self.dead is not None:
                raise EngineDeadError(self.dead)
            if len(self.streams) >= self.capacity:
                raise QueueFullError(f"request queue is full ({self.args.max_num_seqs} running, "
                                     f"{self.args.max_queue_size} waiting)")
            if request_id in self.streams:
                raise ValueError(f"request id {request_id!r} is already running")
            self.streams[request_id] = (loop, q)
        # validation errors of add_request come back through the stream, before any output
        self.inbox.put(("add", (prompt, params, request_id, priority, prompt_ids, deadline, fault)))
        self.wakeup.set()
        finished = False
        try:
            while True:
                out = await q.get()
                if isinstance(out, BaseException):
                    finished = True
                    raise out
                if out.error is not None:
                    finished = True
                    raise RequestFailedError(out.error)
                finished = out.finished
                yield out
                if finished:
                    return
        finally:
            if not finished:  # the consumer went away: free its KV now
                self.abort(request_id)

    def abort(self, request_id: str):
        self.inbox.put(("abort", request_id))
        self.wakeup.set()

    def stats(self) -> dict:
        return self._stats

    def routing_counts(self) -> torch.Tensor | None:
        """`LLMEngine.routing_counts` as the engine thread last published them, up to about a second old (any thread:
        the metrics'; no device work)."""
        return self.routing

    def drain_steps(self) -> list[tuple[int, float]]:
        """(tokens, wall seconds) of each step run since the last call (any thread: the metrics thread's
        histograms)."""
        return [self.steps.popleft() for _ in range(len(self.steps))]

    def shutdown(self):
        self.stopped = True
        self.wakeup.set()
        self.thread.join(timeout=30)

    # ---- engine thread ------------------------------------------------------------------
    def _send(self, request_id: str, item):
        with self.lock:
            target = self.streams.get(request_id)
            if target is not None and (isinstance(item, BaseException) or item.finished):
                del self.streams[request_id]
        if target is not None:
            loop, q = target
            with contextlib.suppress(RuntimeError):  # that caller's loop is closed: nobody to tell
                loop.call_soon_threadsafe(q.put_nowait, item)

    def _deliver(self):
        """The held outputs to their streams (`overlap_outputs`)."""
        held, self.held = self.held, []
        for out in held:
            self._send(out.request_id, out)

    def _drain_inbox(self):
        while True:
            try:
                kind, payload = self.inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                prompt, params, request_id, priority, prompt_ids, deadline, fault = payload
                if request_id not in self.streams:  # aborted before it got here
                    continue
                try:
                    self.engine.add_request(prompt, params, request_id, priority, prompt_ids, deadline, fault)
                except Exception as e:
                    self._send(request_id, e)
            else:
                self._deliver()  # a stream's outputs in order: the held ones before its abort's
                out = self.engine.abort(payload)
                if out is not None:
                    self._send(payload, out)

    def _publish(self, interval_s: float = 0.5):
        """What other threads read (`stats`, `routing_counts`). The routed-token counts are copied to the host behind
        the queued steps every `interval_s`, without waiting, and published once landed. Read from the device by the
        metrics thread itself, the copy waited behind the queued steps (36 ms at 32 users) and, with steps queued,
        every stream stalled about as often as a request ended; without that read the stalls went from 15 to 7 a
        second (H100, journal 2026-12-07 42a)."""
        self._stats = self.engine.stats()
        read = self.routing_read
        if read is not None and read.ready():
            self.routing, self.routing_read = read.host, None
        if self.engine.moe_layers and self.routing_read is None and time.monotonic() >= self.routing_due:
            with self.engine.on_device():  # (the event on the engine's device)
                self.routing_read = QueuedRead(torch.stack([m.routed_tokens for m in self.engine.moe_layers]))
            self.routing_due = time.monotonic() + interval_s

    def _run(self):
        try:
            self._serve()
        except BaseException as e:  # noqa: BLE001 - the thread ends here: nobody may be left waiting on it
            self._die(e)

    def _die(self, error: BaseException):
        self._deliver()  # outputs of the last step: finished requests end as they did
        with self.lock:
            self.dead = f"the engine stopped: {error!r}"
            streams = list(self.streams.values())
            self.streams.clear()
        for loop, q in streams:
            with contextlib.suppress(RuntimeError):  # that caller's loop is closed: nobody to tell
                loop.call_soon_threadsafe(q.put_nowait, EngineDeadError(self.dead))
        if self.on_death is not None:
            self.on_death(self.dead)

    def _serve(self):
        while not self.stopped:
            self._drain_inbox()
            if not self.engine.has_unfinished():
                self._publish()
                self.wakeup.wait(timeout=0.5)
                self.wakeup.clear()
                continue
            if self.engine.faults and "engine" in self.engine.faults.values():
                raise InjectedFault("injected fault in the engine thread (test hook)")
            start = time.perf_counter()
            try:
                outputs = self.engine.step()
            except Exception as e:  # fail the requests of this step, keep serving the rest
                outputs = self.engine.fail_step(e)
            if self.engine.plan or self.engine.layered_plan:
                self.steps.append((self.engine.step_tokens(), time.perf_counter() - start))
            self._deliver()  # (held by a step that queued nothing on the device)
            self.held = outputs
            if not self.overlap_outputs or not self.engine.has_unfinished():
                self._deliver()
            self._publish()
        self._deliver()
        for request_id in list(self.engine.requests):  # shutdown: end every stream
            out = self.engine.abort(request_id)
            self._send(request_id, out)
