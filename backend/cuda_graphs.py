"""Decode steps replayed as CUDA graphs, as vLLM does: a decode step of a MoE model launches
hundreds of small kernels, and from Python that launch time, not the GPU, sets the step time
(BENCHMARKS.md section 1). One graph per batch size, captured the first time that size decodes:
the whole forward (embedding, every layer, the decode attention kernels, the fused MoE kernels,
the final norm) over static input buffers; `capture_all` captures every size up front (the server
does, at start-up). A replay copies the step's tokens, positions and block tables into those buffers
and launches the graph once.

What a graph cannot hold runs eagerly: prefill chunks, and the blocks a decode step fills, which
`PagedKVCache.commit` compresses after the step. Models whose experts stream from host memory
(backend/experts.py) decide on the host which experts to copy, so they are not captured.
"""
from __future__ import annotations

import time

import torch

from backend.kv_cache import AttentionBatch, PagedKVCache, SeqKV
from backend.model import MoE, Transformer


class DecodeGraphs:
    def __init__(self, model: Transformer, cache: PagedKVCache, max_batch: int, max_len: int, capture: bool = True):
        """`capture=False` runs the same static buffers eagerly (a CPU test of everything but the capture)."""
        self.model, self.cache, self.max_batch, self.capture = model, cache, max_batch, capture
        device = cache.device
        self.tokens = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.meta = cache.decode_buffers(max_batch, max_len)
        self.graphs: dict[int, tuple | None] = {}  # batch size -> (graph, its hidden states); None: not captured
        self.pool = None  # one memory pool shared by every graph (they never run at once)

    @staticmethod
    def supported(model: Transformer, cache: PagedKVCache) -> bool:
        """On CUDA, with a decode kernel for the cache's format and every expert resident."""
        return (str(cache.device).startswith("cuda") and cache.decode_kernel is not None
                and all(m.experts is None for m in model.modules() if isinstance(m, MoE)))

    def run(self, tokens: list[int], positions: list[int], batch: AttentionBatch) -> torch.Tensor | None:
        """Final hidden states [B, hidden] of a decode step, or None when the step is not a decode of at
        most `max_batch` sequences (the caller runs it eagerly)."""
        B = len(batch.seqs)
        if B > self.max_batch or any(n != 1 for n in batch.query_lens):
            return None
        self.cache.wait_compressed()  # the side stream's compression: waited for outside the graph
        batch.decode_meta = self.cache.build_decode_meta(batch, self.meta)
        self.tokens[:B].copy_(torch.tensor(tokens), non_blocking=True)
        self.positions[:B].copy_(torch.tensor(positions), non_blocking=True)
        if B not in self.graphs:
            self.graphs[B] = self._capture(B, batch) if self.capture else None
        if self.graphs[B] is None:
            return self.model(self.tokens[:B], self.positions[:B], self.cache, batch)
        graph, hidden = self.graphs[B]
        graph.replay()
        return hidden

    def capture_all(self) -> float:
        """Capture every batch size up to `max_batch` now, as vLLM does at start-up, so that no request waits
        for a capture (the server does this; offline use captures on first use). Throwaway sequences of one
        token drive the captures and are freed. Returns the seconds taken."""
        start = time.perf_counter()
        cache = self.cache
        # a sequence holds a block (and a window slot): batches larger than the cache can hold never run
        largest = min(self.max_batch, cache.allocator.num_free)
        if cache.windowed:
            largest = min(largest, len(cache.free_slots))
        for B in range(largest, 0, -1):  # largest first: the smaller graphs reuse its pool's memory
            seqs = [SeqKV() for _ in range(B)]
            try:
                for seq in seqs:
                    cache.allocate(seq, 1)
                self.run([0] * B, [0] * B, AttentionBatch(seqs, [1] * B))
            finally:
                for seq in seqs:
                    cache.free(seq)
        if self.capture:
            torch.cuda.synchronize(cache.device)
        return time.perf_counter() - start

    def _capture(self, B: int, batch: AttentionBatch) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture the forward of B sequences. It runs once eagerly first, on a side stream as PyTorch's
        recipe asks (Triton compiles its kernels there): that run writes this step's keys and values,
        and the replay that follows writes the same ones again."""
        args = (self.tokens[:B], self.positions[:B], self.cache, batch)
        with torch.cuda.device(self.cache.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.model(*args)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                hidden = self.model(*args)
        self.pool = graph.pool()
        return graph, hidden
