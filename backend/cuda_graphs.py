"""Engine steps replayed as CUDA graphs, as vLLM does: a step of a MoE model launches hundreds of small
kernels, and from Python that launch time, not the GPU, sets the step time (BENCHMARKS.md section 1).
A graph holds the whole forward (embedding, every layer, the attention kernels, the fused MoE kernels,
the final norm) over static input buffers; a replay copies the step's tokens, positions and block tables
into those buffers and launches the graph once.

Kinds of step replay graphs:
- decode steps, one graph per batch size (every size up to `max_batch`);
- steps that carry prompt chunks beside decodes, up to `max_tokens` tokens, one graph per size bucket
  (`token_sizes`): the step's rows are padded to the bucket with rows that write and read the cache's
  scratch block (or window slot) only, and take the first row's experts at weight 0 (no expert is read, or
  streamed in, for padding). Page-addressed formats attend with the tiles kernel
  (kernels/paged_attention.py `paged_tiles_attention`), which takes the prompt chunks' causal rows and the
  decodes in one launch;
  windowed formats (ALR-KVD, KIVI) read every row as a decode of its own length (ALR-KVD a chunk's rows in tiles),
  with chunks that end at their block's end (`PagedKVCache.mixed_rows_supported`, `mixed_chunk_limit`), or for
  ALR-KVD cross blocks in a run of window slots (`PagedKVCache.take_run`: the rows read the blocks closed before the
  chunk, then the run). The scheduler cuts prompt chunks beside decodes to fit;
- with `piecewise` (EngineArgs.piecewise_graphs), windowed formats' chunks beside decodes are not cut, and
  steps whose prompt chunks cross a block's end where no run holds them, or whose prompt rows would read a long
  compressed history (`GRAPH_MAX_HISTORY_READS`), up to `max_tokens` tokens, replay piecewise, as
  vLLM captures: a graph of everything between two layers' attention (49 for 48 layers, per size bucket),
  replayed in turn with each layer's attention run eagerly between them (`PagedKVCache.attend`: the closed
  history rebuilt, flash attention, the decodes beside through the decode kernel), through static buffers of
  its inputs and output. The attention launches a few kernels a layer; the rest of the step, hundreds.
- with `layer_groups` (EngineArgs.layered_prefill; page-addressed formats, and ALR-KVD with its chunks across blocks
  in runs of window slots held through the groups), a layered step's group of layers of the prompt chunks beside
  the decodes' graph: a graph per (group, size bucket up to a step's token budget), from and into static buffers of
  the chunks' residual stream (`run_layers`).
Graphs are captured the first time a size runs; `capture_all` captures every size up front (the server
does, at start-up).

What a graph cannot hold runs eagerly: larger steps (a prompt alone, in chunks of up to
`max_num_batched_tokens`), windowed formats' prompt chunks that cross a block's end without `piecewise` (prompts
with nobody decoding beside them, which the scheduler does not cut), and windowed formats' prompt rows over long
compressed histories without `piecewise` (`GRAPH_MAX_HISTORY_READS`: each tile of rows would read the whole history
through the decode kernel, where an eager step rebuilds it once for flash attention). The blocks a step fills, which
`PagedKVCache.commit` compresses after it, replay graphs of their own (`CompressGraphs`, ALR-KVD), two around the
one call in which the host waits.
Models whose experts stream from host memory are captured when the device decides which experts to copy
(backend/graph_experts.py), not when the host does (backend/experts.py).
"""
from __future__ import annotations

import time

import torch

from backend.copies import queued_copy
from backend.kv_cache import AttentionBatch, PagedKVCache, SeqKV
from backend.model import MoE, Transformer

TOKEN_SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048)  # graph sizes of steps with prompt chunks, up to max_tokens
# A windowed format's mixed graph reads a prompt chunk's rows through the decode kernel, each tile of rows over the
# whole compressed history: past this many (row, history token) pairs a step runs eagerly, where the history is
# rebuilt once and read by flash attention. H100, Qwen3-30B-A3B, ALR-KVD (journal 2026-12-06 26b): a 248-token chunk
# beside 8 decodes after 2,048 tokens (0.5M pairs) 51.5 ms as a graph against 85.2 eagerly, after 8,192 (2.0M) 111.0
# against 89.9; a 2,044-token chunk after 12,288 (25M) 541 against 147 (fp16's graph 119).
GRAPH_MAX_HISTORY_READS = 1_500_000


def ladder(most: int) -> list[int]:
    """Graph sizes up to `most` rows: TOKEN_SIZES below it, then `most` (none for 0)."""
    return [s for s in TOKEN_SIZES if s < most] + [most] if most else []


class StepGraphs:
    def __init__(self, model: Transformer, cache: PagedKVCache, max_batch: int, max_len: int, max_tokens: int = 0,
                 capture: bool = True, piecewise: bool = False, layer_groups: list[tuple[int, int]] = (),
                 layer_tokens: int = 0):
        """`max_tokens`: the most tokens of a step with prompt chunks that replays a graph (0, or a cache whose
        rows cannot attend so, `PagedKVCache.mixed_rows_supported`: decode steps only). `capture=False` runs the
        same static buffers eagerly (a CPU test of everything but the capture). `piecewise`: windowed formats'
        steps whose attention runs eagerly (chunks across blocks, long histories) as graph pieces (the module's
        docstring). `layer_groups`: the (first, last) layers a layered prefill step runs beside decodes
        (`EngineArgs.layered_prefill`), as graphs of up to `layer_tokens` rows (default `max_tokens`; page-addressed
        formats)."""
        self.model, self.cache, self.max_batch, self.capture = model, cache, max_batch, capture
        self.max_tokens = max(max_tokens, max_batch) if max_tokens and cache.mixed_rows_supported() else 0
        self.token_sizes = ladder(self.max_tokens)
        # layered prefill: a group of layers of the prompt chunks a step, beside the decodes' graph. Eager, such a
        # step was bound by its launches: 7.4 ms for 6 layers of 96 rows beside a 9.7 ms decode graph (H100, Qwen3-
        # 30B-A3B, journal 2026-12-07 32a); as graphs 14.5 ms beside 11.9 (33a). Their residual stream goes from
        # graph to graph in static buffers; windowed formats' chunks across blocks hold a run of window slots
        # (below) through all the groups, so of those only formats with runs (ALR-KVD) layer in graphs
        layer_rows = self.layer_rows(self.max_tokens, layer_groups, layer_tokens)
        if self.max_tokens:  # windowed formats: chunks across blocks in runs of window slots
            cache.add_window_runs(max(self.max_tokens, layer_rows))
        self.layer_groups = list(layer_groups) if layer_rows and (not cache.windowed or cache.window_runs) else []
        self.layer_tokens = layer_rows if self.layer_groups else 0
        self.layer_sizes = ladder(self.layer_tokens)
        rows = max(max_batch, self.max_tokens, self.layer_tokens)
        device = cache.device
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.valid = torch.zeros(rows, dtype=torch.bool, device=device)  # mixed steps: the step's rows, not padding
        most = max(self.max_tokens, self.layer_tokens)
        self.meta = cache.decode_buffers(rows, max_len, cache.num_tiles(most, max_batch) if most else 0)
        # routed-token counters add one per (token, expert) pair: zeros for a graph's padding rows
        self.routed_ones = next((m.routed_ones for m in model.modules()
                                 if isinstance(m, MoE) and m.routed_ones is not None), None)
        self.top_k = model.cfg.num_experts_per_tok
        self.graphs: dict[tuple[str, int], tuple | None] = {}  # ("decode", B), ("mixed", T) -> (graph, hidden);
        # ("pieces", T) -> ([graph per stretch between attentions], hidden)
        self.pool = None  # one memory pool shared by every graph (they never run at once)
        self.piecewise = piecewise and bool(self.max_tokens) and cache.windowed
        # the blocks a step fills, compressed at commit: two graphs around the host's wait (ALR-KVD)
        kernel = cache.use_triton and cache.compress_blocks is not None
        self.compression = CompressGraphs(cache, capture) if kernel else None
        if self.compression is not None:
            cache.compress_blocks = self.compression
        self.layer_buffers: dict[tuple, torch.Tensor] = {}  # by trailing shape: [H], or a MoE's pairs [top_k, H]
        if self.layer_groups:
            self.layer_residual = torch.zeros(self.layer_tokens, model.cfg.hidden_size, device=device,
                                              dtype=model.embed_tokens.weight.dtype)
        if self.piecewise:  # a layer's attention inputs and output between graph pieces
            cfg, dtype = model.cfg, model.embed_tokens.weight.dtype
            self.attn_in = [torch.zeros(self.max_tokens, h, cfg.head_dim, dtype=dtype, device=device)
                            for h in (cfg.num_heads, cfg.num_kv_heads, cfg.num_kv_heads, cfg.num_kv_heads)]
            self.attn_out = torch.zeros_like(self.attn_in[0])

    @staticmethod
    def supported(model: Transformer, cache: PagedKVCache) -> bool:
        """On CUDA, with a decode kernel for the cache's format and every expert resident or streamed by
        decisions on the device."""
        return (str(cache.device).startswith("cuda") and cache.decode_kernel is not None
                and all(m.experts is None or getattr(m.experts.cache, "graph_safe", False)
                        for m in model.modules() if isinstance(m, MoE)))

    def run(self, tokens: list[int] | torch.Tensor, positions: list[int], batch: AttentionBatch) -> torch.Tensor | None:
        """Final hidden states [T', hidden] of the step (its T tokens' rows first), or None when no graph takes
        the step (the caller runs it eagerly). `tokens` on the device: a step queued behind the one that drew them."""
        B, T = len(batch.seqs), len(tokens)
        if B > self.max_batch:
            return None
        if all(n == 1 for n in batch.query_lens):
            key, size, pad, num_tiles = ("decode", B), B, (0, 0, 0), 0
        else:
            # windowed formats: the attention eager (graph pieces, or the whole step) for a chunk across blocks that
            # no run holds, or prompt rows over long compressed histories (the history rebuilt once, flash attention)
            limit = self.cache.mixed_chunk_limit
            eager_attention = (any(n > limit(s, taking=False) for s, n in zip(batch.seqs, batch.query_lens))
                               or self.cache.history_reads(batch) > GRAPH_MAX_HISTORY_READS)
            if T > self.max_tokens or (eager_attention and not self.piecewise):
                return None
            size = next(s for s in self.token_sizes if s >= T)
            # padding rows write into the cache's scratch block (windowed formats: its scratch window slot)
            place = (self.cache.scratch_block, self.cache.scratch_slot)
            # pieces: the attention eagerly between graph pieces, of the step's T rows (padding rows read zeros)
            key = ("pieces" if eager_attention else "mixed", size)
            pad, num_tiles = (size - T, *place), self.cache.num_tiles(size, self.max_batch)
        if key[0] != "pieces":  # (the eager attention between pieces builds what it reads)
            batch.decode_meta = self.cache.build_decode_meta(batch, self.meta, pad, num_tiles, self.cache.rows_apart)
        queued_copy(self.tokens[:T], tokens if torch.is_tensor(tokens) else torch.tensor(tokens))
        if size > T:
            self.tokens[T:size].zero_()
        self._rows(positions, size, batch, mixed=key[0] != "decode")
        if key not in self.graphs:
            capture = self._capture_pieces if key[0] == "pieces" else self._capture
            self.graphs[key] = capture(size, batch) if self.capture else None
        if key[0] == "pieces":
            hidden = self._run_pieces(key, T, batch)
        elif self.graphs[key] is None:
            hidden = self.model(self.tokens[:size], self.positions[:size], self.cache, batch)
        else:
            graph, hidden = self.graphs[key]
            graph.replay()
        self._count_all_rows(T, size)
        return hidden

    def run_layers(self, hidden: torch.Tensor, residual: torch.Tensor | None, positions: list[int],
                   batch: AttentionBatch, first: int, last: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Layers [first, last) of a layered step's prompt chunks (`LLMEngine._run_layers`) as a graph over the rows'
        residual stream (`hidden`, `residual`; None before the first layer): the two after them, views of the static
        buffers that the next group's graph reads. None where no graph takes the group (more rows than `layer_tokens`,
        other layers, a windowed format without runs): the caller runs it eagerly. A chunk across blocks of a
        windowed format holds its run from its first group to its last (`LLMEngine.schedule`)."""
        T = len(positions)
        if (first, last) not in self.layer_groups or T > self.layer_tokens:
            return None
        size = next(s for s in self.layer_sizes if s >= T)
        key = ("layers", first, size)
        pad = (size - T, self.cache.scratch_block, self.cache.scratch_slot)
        num_tiles = self.cache.num_tiles(size, self.max_batch)
        batch.decode_meta = self.cache.build_decode_meta(batch, self.meta, pad, num_tiles)
        self._rows(positions, size, batch, mixed=True)
        inputs = self._layer_buffer(tuple(hidden.shape[1:]))  # (the embedding's rows, or the last group's output)
        for buf, x in ((inputs, hidden), (self.layer_residual, residual)):
            if x is None:  # before the first layer: a residual of zeros adds nothing (Block: h + 0 = h)
                buf[:T].zero_()
            elif x.data_ptr() != buf.data_ptr():
                buf[:T].copy_(x)
            if size > T:
                buf[T:size].zero_()
        if key not in self.graphs:
            self.graphs[key] = self._capture_layers(size, first, last, batch, inputs) if self.capture else None
        if self.graphs[key] is None:
            out = self._store_layers(size, *self._layers_forward(size, first, last, batch, inputs))
        else:
            graph, captured_inputs, out = self.graphs[key]
            assert captured_inputs is inputs, "a layer group's graph reads the buffer of the shape it was captured with"
            graph.replay()
        self._count_all_rows(T, size)
        return out[:T], self.layer_residual[:T]

    def layers_read_little(self, seq: SeqKV, rows: int) -> bool:
        """Whether `rows` rows of `seq` may go through the layers in groups here: not where a windowed format's group
        graphs would read a long compressed history through the decode kernel for each row (as `run`, past
        `GRAPH_MAX_HISTORY_READS`; such a chunk goes into a mixed step, whose attention then runs eagerly)."""
        return not self.layer_groups or rows * self.cache.closed_history(seq) <= GRAPH_MAX_HISTORY_READS

    @staticmethod
    def layer_rows(max_tokens: int, layer_groups, layer_tokens: int) -> int:
        """The most rows of a layered group's graph: `layer_tokens` (at least, and by default, `max_tokens`, the
        mixed graphs' rows); 0 without groups or graphs of prompt rows. (The engine sizes the decode kernels by it.)"""
        return max(layer_tokens or max_tokens, max_tokens) if layer_groups and max_tokens else 0

    def _rows(self, positions: list[int], size: int, batch: AttentionBatch, mixed: bool):
        """The step's positions and, in a step with prompt rows, which of its `size` rows are its own; the padding
        rows at position 0 count no routed token (they route to no expert of their own: MoE.forward)."""
        T = len(positions)
        queued_copy(self.positions[:T], torch.tensor(positions))
        if mixed:
            self.valid[:T].fill_(True)
            self.valid[T:size].fill_(False)
            batch.valid_rows = self.valid[:size]
        if size > T:
            self.positions[T:size].zero_()
            if self.routed_ones is not None:
                self.routed_ones[T * self.top_k:size * self.top_k].zero_()

    def _count_all_rows(self, T: int, size: int):
        """After a padded step: every row counts its routed tokens again (`_rows` zeroed the padding's)."""
        if size > T and self.routed_ones is not None:
            self.routed_ones[T * self.top_k:size * self.top_k].fill_(1)

    def _layer_buffer(self, tail: tuple) -> torch.Tensor:
        """The static buffer of layered rows of this trailing shape (hidden states, or a MoE's unreduced pairs)."""
        if tail not in self.layer_buffers:
            self.layer_buffers[tail] = torch.zeros(self.layer_tokens, *tail, device=self.cache.device,
                                                   dtype=self.model.embed_tokens.weight.dtype)
        return self.layer_buffers[tail]

    def _layers_forward(self, size: int, first: int, last: int, batch: AttentionBatch, inputs: torch.Tensor):
        return self.model.forward_layers(inputs[:size], self.layer_residual[:size], self.positions[:size], self.cache,
                                         batch, first, last)

    def _store_layers(self, size: int, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """A group's output rows into the static buffers (the output's own: the next group reads it)."""
        out = self._layer_buffer(tuple(hidden.shape[1:]))
        out[:size].copy_(hidden)
        self.layer_residual[:size].copy_(residual)
        return out

    def capture_all(self) -> float:
        """Capture every size now, as vLLM does at start-up, so that no request waits for a capture (the server
        does this; offline use captures on first use). Throwaway sequences drive the captures and are freed:
        B sequences of one token for decode sizes, prompts of T tokens in all for mixed sizes (one sequence, or
        for windowed formats sequences of a block each), and for each layer group such prompts through its layers;
        piecewise sizes need none. Returns the seconds taken."""
        start = time.perf_counter()
        cache = self.cache
        if self.compression is not None:
            self.compression.capture_all()
        for size in reversed(self.token_sizes if self.piecewise and self.capture else []):
            batch = AttentionBatch([], [])  # neither the warm-up nor the capture attends
            batch.valid_rows = self.valid[:size]
            self.graphs[("pieces", size)] = self._capture_pieces(size, batch)
        # a sequence holds a block (and a window slot): batches larger than the cache can hold never run
        largest = min(self.max_batch, cache.allocator.num_free)
        if cache.windowed:
            largest = min(largest, len(cache.free_slots))

        def prompts(sizes: list[int]) -> list[list[int]]:  # largest first: the smaller graphs reuse its pool's memory
            return [cache.new_prompt_chunks(T) for T in reversed(sizes)
                    if cache.allocator.num_free > -(-T // cache.block_size)
                    and len(cache.new_prompt_chunks(T)) <= largest]

        drives = prompts(self.token_sizes) + [[1] * B for B in range(largest, 0, -1)]

        def drive(query_lens: list[int], run):  # throwaway sequences of these lengths through `run`
            seqs = [SeqKV() for _ in query_lens]
            try:
                for seq, n in zip(seqs, query_lens):
                    cache.allocate(seq, n)
                run([p for n in query_lens for p in range(n)], AttentionBatch(seqs, query_lens))
            finally:
                for seq in seqs:
                    cache.free(seq)

        for query_lens in drives:
            drive(query_lens, lambda positions, batch: self.run([0] * len(positions), positions, batch))

        def through_the_groups(positions: list[int], batch: AttentionBatch):  # each group takes the last one's output
            hidden, residual = torch.zeros(len(positions), self.model.cfg.hidden_size, device=cache.device,
                                           dtype=self.model.embed_tokens.weight.dtype), None
            for first, last in self.layer_groups:
                hidden, residual = self.run_layers(hidden, residual, positions, batch, first, last)

        for query_lens in prompts(self.layer_sizes):  # prompts of T tokens in all through the layers
            drive(query_lens, through_the_groups)
        if self.capture:
            torch.cuda.synchronize(cache.device)
        return time.perf_counter() - start

    def _run_pieces(self, key: tuple[str, int], T: int, batch: AttentionBatch) -> torch.Tensor:
        """A step whose attention runs eagerly between graph pieces (or, uncaptured, the same buffers eagerly)."""
        size = key[1]
        self.attn_out[T:size].zero_()
        if self.graphs[key] is None:
            return self.model(self.tokens[:size], self.positions[:size], _AttentionBreaks(self, T, batch), batch)
        pieces, hidden = self.graphs[key]
        for layer, graph in enumerate(pieces):
            graph.replay()
            if layer < len(pieces) - 1:
                self._attend(layer, T, batch)
        return hidden

    def _attend(self, layer: int, T: int, batch: AttentionBatch):
        """Layer `layer`'s attention of the step's T rows, from the static inputs into the static output."""
        q, k, k_rot, v = (x[:T] for x in self.attn_in)
        self.attn_out[:T].copy_(self.cache.attend(layer, q, k, k_rot, v, batch))

    def _warm_up(self, size: int, forward) -> torch.cuda.Stream:
        """`forward()` of `size` rows once, eagerly, on a side stream, as PyTorch's recipe asks before a capture
        (Triton compiles its kernels there); it counts no routed token (the replays do). Returns the stream."""
        ones = None if self.routed_ones is None else self.routed_ones[:size * self.top_k]
        counted = None if ones is None else ones.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            if ones is not None:
                ones.zero_()
            forward()
            if ones is not None:
                ones.copy_(counted)
        torch.cuda.current_stream().wait_stream(side)
        return side

    def _capture_pieces(self, size: int, batch: AttentionBatch) -> tuple[list[torch.cuda.CUDAGraph], torch.Tensor]:
        """Capture the forward of `size` rows as a graph per stretch between two layers' attention, on the warm-up's
        side stream. Neither the warm-up nor the capture attends (the attention's output buffer is read as it is)
        or writes the cache."""
        with torch.cuda.device(self.cache.device):
            side = self._warm_up(size, lambda: self.model(self.tokens[:size], self.positions[:size],
                                                          _AttentionBreaks(self, 0, batch), batch))
            with torch.cuda.stream(side):
                breaks = _AttentionBreaks(self, 0, batch, capture=True)
                hidden = self.model(self.tokens[:size], self.positions[:size], breaks, batch)
                breaks.next_piece(last=True)
            torch.cuda.current_stream().wait_stream(side)
        return breaks.pieces, hidden

    def _capture(self, size: int, batch: AttentionBatch) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture the forward of `size` rows, after the warm-up: that run writes this step's keys and values,
        and the replay that follows writes the same ones again."""
        with torch.cuda.device(self.cache.device):
            self._warm_up(size, lambda: self.model(self.tokens[:size], self.positions[:size], self.cache, batch))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                hidden = self.model(self.tokens[:size], self.positions[:size], self.cache, batch)
        self.pool = graph.pool()
        return graph, hidden

    def _capture_layers(self, size: int, first: int, last: int, batch: AttentionBatch,
                        inputs: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        """Capture layers [first, last) of `size` rows from the static buffers back into them, after the warm-up
        (which writes the step's keys and values of those layers, as the replay that follows does again, and shows
        the output's shape). Returns the graph, the buffer it reads and the one it leaves the output in."""
        shape = []
        with torch.cuda.device(self.cache.device):
            self._warm_up(size, lambda: shape.append(self._layers_forward(size, first, last, batch, inputs)[0].shape))
            out = self._layer_buffer(tuple(shape[0][1:]))  # (allocated outside the graph's pool)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self._store_layers(size, *self._layers_forward(size, first, last, batch, inputs))
        self.pool = graph.pool()
        return graph, inputs, out


class _AttentionBreaks:
    """What the model takes for its KV cache in a piecewise step: each layer's attention copies its inputs to
    the runner's static buffers and returns its static output. Running the step (T rows, uncaptured), the attention
    runs there, eagerly; capturing, it ends the graph captured so far and begins the next (`T` 0: no attention)."""

    def __init__(self, runner: StepGraphs, T: int, batch: AttentionBatch, capture: bool = False):
        self.runner, self.T, self.batch, self.capture = runner, T, batch, capture
        self.pieces: list[torch.cuda.CUDAGraph] = []
        if capture:
            self.next_piece()

    def next_piece(self, last: bool = False):
        if self.pieces:
            self.pieces[-1].capture_end()
        if not last:
            if self.runner.pool is None:
                self.runner.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin(pool=self.runner.pool)
            self.pieces.append(graph)

    def attend(self, layer: int, q, k, k_rot, v, batch) -> torch.Tensor:
        assert layer == len(self.pieces) - 1 or not self.capture, "layers attend in order"
        size = q.shape[0]
        for buf, x in zip(self.runner.attn_in, (q, k, k_rot, v)):
            buf[:size].copy_(x)
        if self.capture:
            self.next_piece()
        elif self.T:
            self.runner._attend(layer, self.T, self.batch)
        return self.runner.attn_out[:size]


class CompressGraphs:
    """A windowed format's compression of full blocks (ALR-KVD's `encode_with_kernel`) replayed as two CUDA graphs
    around its one call where the host waits, the Rayleigh-Ritz eigh (it checks its result on the host). Eagerly,
    the hundred-odd small kernels of the basis (subspace iteration, rank allocation, stores) took 4.5 ms of host
    time for one sequence's 48 blocks on the H200 (journal 2026-11-30): a decode step that closed a block took
    twice its neighbours. One pair of graphs per block count in `sizes` (a call padded up with blocks of zeros that
    write the cache's scratch block), over static buffers of the blocks, their storage rows and first positions.
    `capture=False` runs the same buffers eagerly (a CPU test of everything but the capture)."""

    def __init__(self, cache: PagedKVCache, capture: bool = True):
        self.cache, self.format, self.capture = cache, cache.format, capture
        most, num_layers = cache.COMPRESS_CHUNK, cache.cfg.num_layers
        # a decode step's blocks are every layer's of each sequence that closes one: 1, 2, 4... sequences
        self.sizes = sorted({min(num_layers << i, most) for i in range((most // num_layers).bit_length() + 1)})
        T, H, D = cache.block_size, cache.cfg.num_kv_heads, cache.cfg.head_dim
        self.k = torch.zeros(most, T, H, D, dtype=cache.dtype, device=cache.device)
        self.v = torch.zeros_like(self.k)
        self.rows = torch.zeros(most, dtype=torch.long, device=cache.device)
        self.starts = torch.zeros_like(self.rows)
        self.scratch_row = self.format.storage_rows([0], [cache.scratch_block])[0]
        self.graphs: dict[int, tuple | None] = {}  # size -> (first graph, its M, last graph, eigenpairs, outputs)
        self.pool = None

    def __call__(self, layers: list[int], block_ids: list[int], k: torch.Tensor, v: torch.Tensor,
                 start_pos: list[int]) -> None:
        """`encode_with_kernel`'s contract (at most `cache.COMPRESS_CHUNK` blocks)."""
        n = len(block_ids)
        size = next(s for s in self.sizes if s >= n)
        pad = size - n
        rows = self.format.storage_rows(layers, block_ids) + [self.scratch_row] * pad
        for buf, values in ((self.rows, rows), (self.starts, list(start_pos) + [0] * pad)):
            queued_copy(buf[:size], torch.tensor(values))
        self.k[:n].copy_(k)
        self.v[:n].copy_(v)
        if pad:
            self.k[n:size].zero_()
            self.v[n:size].zero_()
        if size not in self.graphs:
            self.graphs[size] = self._capture(size) if self.capture else None
            if self.graphs[size] is not None:
                return  # the capture's warm-up compressed these blocks
        if self.graphs[size] is None:
            self._stages(size)
            return
        first, M, last, (w, V), _ = self.graphs[size]
        first.replay()
        for buf, x in zip((w, V), self.format.ritz_solve(M)):
            buf.copy_(x)
        last.replay()

    def capture_all(self) -> None:
        """Capture every size now (the server's start-up), on blocks of zeros that write the scratch block."""
        if not self.capture:
            return
        self.rows.fill_(self.scratch_row)
        self.starts.zero_()
        self.k.zero_()
        self.v.zero_()
        for size in reversed(self.sizes):  # largest first: the smaller graphs reuse its pool's memory
            if size not in self.graphs:
                self.graphs[size] = self._capture(size)

    def _stages(self, size: int) -> None:
        fmt, rows, starts = self.format, self.rows[:size], self.starts[:size]
        k, v, Q, M, total = fmt.compress_ritz(self.k[:size], self.v[:size], starts)
        fmt.compress_store(rows, starts, k, v, Q, total, *fmt.ritz_solve(M))

    def _capture(self, size: int) -> tuple:
        """The stages once eagerly on a side stream (Triton compiles, cuBLAS and cuSOLVER set up; this call's blocks
        compressed), then the graph before the eigh and the one after it."""
        fmt, rows, starts = self.format, self.rows[:size], self.starts[:size]
        with torch.cuda.device(self.cache.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._stages(size)
            torch.cuda.current_stream().wait_stream(side)
            first = torch.cuda.CUDAGraph()
            with torch.cuda.graph(first, pool=self.pool):
                ritz = fmt.compress_ritz(self.k[:size], self.v[:size], starts)
            self.pool = first.pool()
            k, v, Q, M, total = ritz
            first.replay()  # the eigh below needs a matrix to decompose; its eigenpairs are the last graph's inputs
            w, V = fmt.ritz_solve(M)
            last = torch.cuda.CUDAGraph()
            with torch.cuda.graph(last, pool=self.pool):
                fmt.compress_store(rows, starts, k, v, Q, total, w, V)
        return first, M, last, (w, V), ritz  # (ritz: the first graph's outputs, held while the last one reads them)
