"""Engine steps replayed as CUDA graphs, as vLLM does: a step of a MoE model launches hundreds of small
kernels, and from Python that launch time, not the GPU, sets the step time (BENCHMARKS.md section 1).
A graph holds the whole forward (embedding, every layer, the attention kernels, the fused MoE kernels,
the final norm) over static input buffers; a replay copies the step's tokens, positions and block tables
into those buffers and launches the graph once.

Two kinds of step replay a graph:
- decode steps, one graph per batch size (every size up to `max_batch`);
- steps that carry prompt chunks beside decodes, up to `max_tokens` tokens, one graph per size bucket
  (`token_sizes`): the step's rows are padded to the bucket with rows that write and read the cache's
  scratch block (or window slot) only, and take the first row's experts at weight 0 (no expert is read, or
  streamed in, for padding). Page-addressed formats attend with the tiles kernel
  (kernels/paged_attention.py `paged_tiles_attention`), which takes the prompt chunks' causal rows and the
  decodes in one launch;
  windowed formats (ALR-KVD, KIVI) read every row as a decode of its own length, with chunks that end at
  their block's end (`PagedKVCache.mixed_rows_supported`, `mixed_chunk_limit`). The scheduler cuts prompt
  chunks beside decodes to fit.
Graphs are captured the first time a size runs; `capture_all` captures every size up front (the server
does, at start-up).

What a graph cannot hold runs eagerly: larger steps (a prompt alone, in chunks of up to
`max_num_batched_tokens`), windowed formats' prompt chunks that cross a block's end (prompts with nobody
decoding beside them, which the scheduler does not cut), and the blocks a step fills, which
`PagedKVCache.commit` compresses after it.
Models whose experts stream from host memory are captured when the device decides which experts to copy
(backend/graph_experts.py), not when the host does (backend/experts.py).
"""
from __future__ import annotations

import time

import torch

from backend.kv_cache import AttentionBatch, PagedKVCache, SeqKV
from backend.model import MoE, Transformer

TOKEN_SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048)  # graph sizes of steps with prompt chunks, up to max_tokens


class StepGraphs:
    def __init__(self, model: Transformer, cache: PagedKVCache, max_batch: int, max_len: int, max_tokens: int = 0,
                 capture: bool = True):
        """`max_tokens`: the most tokens of a step with prompt chunks that replays a graph (0, or a cache whose
        rows cannot attend so, `PagedKVCache.mixed_rows_supported`: decode steps only). `capture=False` runs the same static buffers eagerly
        (a CPU test of everything but the capture)."""
        self.model, self.cache, self.max_batch, self.capture = model, cache, max_batch, capture
        self.max_tokens = max(max_tokens, max_batch) if max_tokens and cache.mixed_rows_supported() else 0
        self.token_sizes = [s for s in TOKEN_SIZES if s < self.max_tokens] + [self.max_tokens] if self.max_tokens else []
        rows = max(max_batch, self.max_tokens)
        device = cache.device
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.valid = torch.zeros(rows, dtype=torch.bool, device=device)  # mixed steps: the step's rows, not padding
        self.meta = cache.decode_buffers(rows, max_len, cache.num_tiles(self.max_tokens, max_batch) if self.max_tokens else 0)
        # routed-token counters add one per (token, expert) pair: zeros for a graph's padding rows
        self.routed_ones = next((m.routed_ones for m in model.modules()
                                 if isinstance(m, MoE) and m.routed_ones is not None), None)
        self.top_k = model.cfg.num_experts_per_tok
        self.graphs: dict[tuple[str, int], tuple | None] = {}  # ("decode", B) or ("mixed", T) -> (graph, hidden)
        self.pool = None  # one memory pool shared by every graph (they never run at once)

    @staticmethod
    def supported(model: Transformer, cache: PagedKVCache) -> bool:
        """On CUDA, with a decode kernel for the cache's format and every expert resident or streamed by
        decisions on the device."""
        return (str(cache.device).startswith("cuda") and cache.decode_kernel is not None
                and all(m.experts is None or getattr(m.experts.cache, "graph_safe", False)
                        for m in model.modules() if isinstance(m, MoE)))

    def run(self, tokens: list[int], positions: list[int], batch: AttentionBatch) -> torch.Tensor | None:
        """Final hidden states [T', hidden] of the step (its T tokens' rows first), or None when no graph takes
        the step (the caller runs it eagerly)."""
        B, T = len(batch.seqs), len(tokens)
        if B > self.max_batch:
            return None
        if all(n == 1 for n in batch.query_lens):
            key, size, pad, num_tiles = ("decode", B), B, (0, 0, 0), 0
        else:
            limit = self.cache.mixed_chunk_limit
            if T > self.max_tokens or any(n > limit(s) for s, n in zip(batch.seqs, batch.query_lens)):
                return None  # too large, or (windowed formats) a prompt alone in chunks across blocks
            size = next(s for s in self.token_sizes if s >= T)
            # padding rows write into the cache's scratch block (windowed formats: its scratch window slot)
            place = (self.cache.scratch_block, self.cache.scratch_slot)
            key, pad, num_tiles = ("mixed", size), (size - T, *place), self.cache.num_tiles(size, self.max_batch)
            self.valid[:T].fill_(True)
            self.valid[T:size].fill_(False)
            batch.valid_rows = self.valid[:size]  # padding rows route to no expert of their own (MoE.forward)
        self.cache.wait_compressed()  # the side stream's compression: waited for outside the graph
        batch.decode_meta = self.cache.build_decode_meta(batch, self.meta, pad, num_tiles)
        self.tokens[:T].copy_(torch.tensor(tokens), non_blocking=True)
        self.positions[:T].copy_(torch.tensor(positions), non_blocking=True)
        if size > T:
            self.tokens[T:size].zero_()
            self.positions[T:size].zero_()
            if self.routed_ones is not None:
                self.routed_ones[T * self.top_k:size * self.top_k].zero_()
        if key not in self.graphs:
            self.graphs[key] = self._capture(size, batch) if self.capture else None
        if self.graphs[key] is None:
            hidden = self.model(self.tokens[:size], self.positions[:size], self.cache, batch)
        else:
            graph, hidden = self.graphs[key]
            graph.replay()
        if size > T and self.routed_ones is not None:
            self.routed_ones[T * self.top_k:size * self.top_k].fill_(1)
        return hidden

    def capture_all(self) -> float:
        """Capture every size now, as vLLM does at start-up, so that no request waits for a capture (the server
        does this; offline use captures on first use). Throwaway sequences drive the captures and are freed:
        B sequences of one token for decode sizes, prompts of T tokens in all for mixed sizes (one sequence, or
        for windowed formats sequences of a block each). Returns the seconds taken."""
        start = time.perf_counter()
        cache = self.cache
        # a sequence holds a block (and a window slot): batches larger than the cache can hold never run
        largest = min(self.max_batch, cache.allocator.num_free)
        if cache.windowed:
            largest = min(largest, len(cache.free_slots))
        drives = [[1] * B for B in range(largest, 0, -1)]  # largest first: the smaller graphs reuse its pool's memory
        drives = [cache.new_prompt_chunks(T) for T in reversed(self.token_sizes)
                  if cache.allocator.num_free > -(-T // cache.block_size)
                  and len(cache.new_prompt_chunks(T)) <= largest] + drives
        for query_lens in drives:
            seqs = [SeqKV() for _ in query_lens]
            try:
                for seq, n in zip(seqs, query_lens):
                    cache.allocate(seq, n)
                T = sum(query_lens)
                self.run([0] * T, [p for n in query_lens for p in range(n)], AttentionBatch(seqs, query_lens))
            finally:
                for seq in seqs:
                    cache.free(seq)
        if self.capture:
            torch.cuda.synchronize(cache.device)
        return time.perf_counter() - start

    def _capture(self, size: int, batch: AttentionBatch) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture the forward of `size` rows. It runs once eagerly first, on a side stream as PyTorch's
        recipe asks (Triton compiles its kernels there): that run writes this step's keys and values,
        and the replay that follows writes the same ones again; it counts no routed token (the replay does)."""
        args = (self.tokens[:size], self.positions[:size], self.cache, batch)
        ones = None if self.routed_ones is None else self.routed_ones[:size * self.top_k]
        counted = None if ones is None else ones.clone()  # the replay counts the step's routed tokens, not this run
        with torch.cuda.device(self.cache.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                if ones is not None:
                    ones.zero_()
                self.model(*args)
                if ones is not None:
                    ones.copy_(counted)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                hidden = self.model(*args)
        self.pool = graph.pool()
        return graph, hidden
