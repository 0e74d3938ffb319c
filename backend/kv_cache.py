"""Paged KV cache: a block allocator with a fixed byte budget, per-sequence block tables, a
full-precision window for compressed formats, and the PyTorch attention paths.

Each sequence owns a list of block ids (`SeqKV.block_table`). For a windowed (compressed)
format its newest, partial block lives in a full-precision window slot until it fills; then
the format compresses it into the block. Attention reads the past of a sequence through
`read` (decode + window), appends the step's new keys and values, and runs SDPA; a decode step
of a page-addressed format writes every sequence's token at once and attends in one batched call.
"""
from __future__ import annotations

import hashlib
import inspect
import itertools
import logging
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from backend.config import ModelConfig
from backend.copies import queued_copy
from backend.kv_formats import FORMATS
from backend.kv_formats.codecs import rotation_matrix, to_bool

logger = logging.getLogger(__name__)

VALUE_ROTATION_SEED = 1234  # `rotate_values`: its randomized Hadamard's signs (a constant, never stored), chosen
# on WikiText-2 validation among six seeds (k4 v2, block 64: perplexity 14.23 against 14.30-14.39)


CACHE_OPTIONS = ("block_size", "sink_tokens", "rotate_values")  # the cache's own options; the rest are its format's


def meta_format(cfg: ModelConfig, kv_format: str, options: dict, dtype):
    """The format of a cache of `kv_format` with `options` (the cache's own and its format's), one block on the meta
    device (no memory): what a block holds and weighs (`bytes_per_block()`)."""
    fmt_cls = FORMATS[kv_format]
    return fmt_cls(num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, dtype=dtype,
                   device="meta", num_blocks=1, block_size=int(options.get("block_size", fmt_cls.default_block_size)),
                   **{k: v for k, v in options.items() if k not in CACHE_OPTIONS})


def dense_kv_bytes(cfg: ModelConfig, tokens: int, itemsize: int) -> int:
    """Keys and values of `tokens` tokens of one sequence, every layer, at `itemsize` bytes an element."""
    return 2 * cfg.num_layers * tokens * cfg.num_kv_heads * cfg.head_dim * itemsize


def attention_probs(q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The attention rows of q [n, Hq, D] over keys [Hkv, L, D] (GQA), as SDPA computes them: [Hq, n, L] float32."""
    group = q.shape[1] // keys.shape[0]
    scores = q.transpose(0, 1).float() @ keys.float().repeat_interleave(group, 0).transpose(1, 2) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1)


@dataclass
class SeqKV:
    block_table: list[int] = field(default_factory=list)
    num_tokens: int = 0          # tokens stored, the same in every layer
    window_slot: int | None = None
    # prefix caching: the prefix hashes of its tokens' first full blocks as far as computed (kept when it is freed:
    # its tokens never change), and how many of its blocks are known by theirs
    prefix_keys: list[bytes] = field(default_factory=list)
    num_keyed_blocks: int = 0
    # `block_table` as int32 (`table_row`): the list it was made from and the copy
    _table: tuple = field(default=(None, None), repr=False, compare=False)

    def table_row(self) -> np.ndarray:
        """`block_table` as int32, made again only when the table grew or was replaced (it is only ever appended to
        or replaced). Converting every table whole each step, a decode step's metadata took 1.07 ms of host time at
        8 x 32k tokens in blocks of 16, 0.21 ms this way (the CPU VM; journal 2026-12-07 38c): time the GPU waits."""
        made_from, row = self._table
        table = self.block_table
        if made_from is not table:
            row = np.array(table, dtype=np.int32)
        elif len(row) < len(table):  # (appended to: the new blocks only)
            row = np.concatenate([row, np.array(table[len(row):], dtype=np.int32)])
        self._table = (table, row)
        return row


def prefix_hash(previous: bytes | None, tokens: list[int]) -> bytes:
    """A full block's key in the prefix cache: its tokens and, through the previous block's key, every token before
    them (what its keys and values depend on)."""
    return hashlib.blake2b((previous or b"") + array("q", tokens).tobytes(), digest_size=16).digest()


@dataclass
class AttentionBatch:
    """The sequences of one forward step, in the order of their tokens in the flat batch."""
    seqs: list[SeqKV]
    query_lens: list[int]
    # tensors of a step whose query rows attend all at once (a decode step, or any step of a CUDA graph),
    # built once for all layers (`build_decode_meta`)
    decode_meta: dict | None = None
    # a CUDA graph's rows [T'] (backend/cuda_graphs.py): True for the step's tokens, False for padding
    valid_rows: torch.Tensor | None = None
    # an eager step's decodes beside prompt chunks, attended apart (windowed formats): (their rows, a batch of
    # them), built once for all layers (`PagedKVCache.decodes_apart`)
    decodes: tuple[torch.Tensor, "AttentionBatch"] | None = None
    # windowed formats on the PyTorch path: each sequence's closed blocks decoded for the layers ahead
    # (`PagedKVCache._closed_history`), by id(sequence)
    history: dict = field(default_factory=dict)


class BlockAllocator:
    """Block ids, each free or held by sequences. With prefix caching (`PagedKVCache.match_prefix`) a full block is
    also known by its prefix hash: several sequences may hold it, and once none does it keeps its contents
    (evictable, the least recently released first) until a new block needs its room."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.free_ids = list(range(num_blocks - 1, -1, -1))
        self.refs = [0] * num_blocks
        self.by_hash: dict[bytes, int] = {}  # prefix hash -> block
        self.hash_of: dict[int, bytes] = {}  # block -> its prefix hash
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached blocks no sequence holds, oldest first

    @property
    def num_free(self) -> int:
        return len(self.free_ids) + len(self.evictable)

    def allocate(self, n: int) -> list[int]:
        if n > self.num_free:
            raise MemoryError(f"KV cache out of blocks: need {n}, have {self.num_free}")
        ids = []
        for _ in range(n):
            if self.free_ids:
                block = self.free_ids.pop()
            else:  # a cached block's room: it leaves the prefix cache
                block, _ = self.evictable.popitem(last=False)
                del self.by_hash[self.hash_of.pop(block)]
            self.refs[block] = 1
            ids.append(block)
        return ids

    def free(self, ids: list[int]):
        for block in reversed(ids):
            assert self.refs[block] > 0, f"block {block} freed twice"
            self.refs[block] -= 1
            if self.refs[block]:
                continue
            if block in self.hash_of:
                self.evictable[block] = None
            else:
                self.free_ids.append(block)

    def hold(self, block: int):
        """Another holder of a cached block."""
        if not self.refs[block]:
            del self.evictable[block]
        self.refs[block] += 1

    def cache(self, block: int, key: bytes):
        """A full block known by its prefix hash from now on (the first block of a hash keeps it)."""
        if key not in self.by_hash and block not in self.hash_of:
            self.by_hash[key], self.hash_of[block] = block, key


class PagedKVCache:
    def __init__(self, cfg: ModelConfig, rotary, kv_format: str = "fp16", kv_options: dict | None = None,
                 budget_bytes: int = 256 << 20, max_num_seqs: int = 16, dtype=torch.float32, device="cpu",
                 attention_backend: str = "auto", max_query_rows: int = 0,
                 prefix_caching: bool = False):
        """`max_query_rows`: the most query rows of a step the decode kernels take (at least `max_num_seqs`;
        more when CUDA graphs carry prompt chunks beside decodes). `prefix_caching`: `match_prefix`."""
        if kv_format not in FORMATS:
            raise ValueError(f"unknown kv format {kv_format!r}; choose from {sorted(FORMATS)}")
        options = dict(kv_options or {})
        fmt_cls = FORMATS[kv_format]
        self.block_size = int(options.pop("block_size", fmt_cls.default_block_size))
        # a sequence's first tokens (the attention sink) kept exactly once their block is compressed
        self.sink_tokens = int(options.pop("sink_tokens", 0))
        if self.sink_tokens and not (fmt_cls.windowed and 0 < self.sink_tokens <= self.block_size):
            raise ValueError(f"sink_tokens must be in 0..block_size ({self.block_size}), for windowed formats only")
        if prefix_caching and self.sink_tokens:  # (a sequence's exact sink lives in its window slot, not its blocks)
            raise ValueError("prefix caching does not take a KV preset with sink_tokens")
        self.prefix_caching = prefix_caching
        # values rotated by a fixed randomized Hadamard R, which the engine folds into the model's value and
        # output projections (Transformer.rotate_values): the format stores V R, the kernels read it as it is
        rotate = to_bool(options.pop("rotate_values", False))
        self.value_rotation = rotation_matrix(cfg.head_dim, VALUE_ROTATION_SEED) if rotate else None
        self.cfg, self.rotary, self.dtype, self.device = cfg, rotary, dtype, device
        shape = dict(num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, dtype=dtype)
        probe = meta_format(cfg, kv_format, kv_options or {}, dtype)
        self.block_bytes = probe.bytes_per_block()
        self.windowed, self.rope_on_read = fmt_cls.windowed, fmt_cls.rope_on_read
        # one more block (and window slot) than sequences can take: the scratch that a CUDA graph's padding
        # rows write into and read (backend/cuda_graphs.py), so a full cache still replays mixed steps
        num_slots = max_num_seqs + 1 if self.windowed else 0
        window_shape = (cfg.num_layers, num_slots, self.block_size, cfg.num_kv_heads, cfg.head_dim)
        # a window slot: its keys and values and the sink's, and for formats that want saliency the attention
        # each window token received
        self.attn_slot_bytes = cfg.num_layers * self.block_size * cfg.num_kv_heads * 4 if probe.wants_saliency else 0
        self.slot_bytes = dense_kv_bytes(cfg, self.block_size + self.sink_tokens, dtype.itemsize) + self.attn_slot_bytes
        num_blocks = (budget_bytes - num_slots * self.slot_bytes) // self.block_bytes
        if num_blocks < 2:
            raise ValueError(f"KV budget of {budget_bytes} bytes holds no block beside the scratch block "
                             f"({self.block_bytes} B per block + {num_slots} window slots of {self.slot_bytes} B)")
        self.format = fmt_cls(**shape, device=device, num_blocks=num_blocks, block_size=self.block_size, **options)
        if hasattr(self.format, "set_rotary"):  # formats that rotate keys themselves (alrkvd post_rope)
            self.format.set_rotary(rotary)
        self.window_k = torch.zeros(window_shape, dtype=dtype, device=device)
        self.window_v = torch.zeros(window_shape, dtype=dtype, device=device)
        sink_shape = (cfg.num_layers, num_slots, self.sink_tokens, cfg.num_kv_heads, cfg.head_dim)
        self.sink_k = torch.zeros(sink_shape, dtype=dtype, device=device)  # in the format's key convention
        self.sink_v = torch.zeros(sink_shape, dtype=dtype, device=device)
        # attention each window token has received so far, per kv head: its saliency when the block closes
        self.window_attn = (torch.zeros(window_shape[:-1], dtype=torch.float32, device=device)
                            if self.format.wants_saliency else None)
        self.allocator = BlockAllocator(num_blocks - 1)
        self.free_slots = list(range(num_slots - 2, -1, -1))
        self.scratch_block, self.scratch_slot = num_blocks - 1, max(num_slots - 1, 0)
        self.num_sequence_slots = num_slots  # the sequences' window slots and the scratch; runs after them
        self.window_runs: list[int] = []     # first slots of the runs (`add_window_runs`)
        self.run_blocks = 1                  # slots per run
        self._runs: dict[int, int] = {}      # id(SeqKV) -> the first slot of the run its chunk takes this step
        self.kv_format = kv_format
        # Fused decode attention on CUDA (kernels/): the format's kernels; the PyTorch path everywhere else and for
        # prefill. The views of its storage that they read are made on every device (a test swaps in the references).
        if attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(f"attention_backend must be auto, torch or triton, not {attention_backend!r}")
        self.decode_kernel = None
        self.tiles_kernel = None  # a step's prompt chunks and decodes in one launch (page-addressed formats)
        self.compress = self._encode_blocks  # a windowed format's full blocks -> their compressed form
        self._filled = []  # blocks this decode step filled, compressed at commit
        # mixed graph steps of a windowed format's decode kernel: this many leading rows (the decodes come first; with
        # fewer decodes, a chunk's first rows too: a graph's launch has a static shape) through a decode launch of their
        # own, the rest in tiles; 0: every row in tiles. A decode row with a long history costs far more in an 8-row
        # tile than alone (H100, one layer of 31 decodes beside a 225-token chunk: 357 against 545 us at 4k, 201 against
        # 161 at 1k); the long-context mix 1.06x the decodes a second and 1.16x the prompt tokens, the short one even
        # (journal 2026-12-07 36d, 37b)
        self.rows_apart = max_num_seqs
        # the decode kernels do not read the sink: with it, the PyTorch path
        self.kernels = None if self.sink_tokens else self.format.kernels(max(max_num_seqs, max_query_rows))
        self.kernel_layers = self.kernels.layers if self.kernels is not None else None
        # the format's compression kernel: its call (or CUDA graphs of it, backend/cuda_graphs.py) per chunk of blocks
        self.compress_blocks = self.kernels.compress if self.kernels is not None else None
        # "triton": the kernels on any device (on the CPU under Triton's interpreter: tests of the CUDA path)
        on_cuda = str(device).startswith("cuda")
        self.use_triton = attention_backend == "triton" or (on_cuda and attention_backend != "torch")
        # a step's new keys and values: one launch (kernels), or two indexed assignments
        from kernels.paged_attention import store_kv, store_kv_ref
        self.store_kv = store_kv if self.use_triton else store_kv_ref
        if self.use_triton:
            if self.sink_tokens:
                logger.warning("sink_tokens=%d: the decode kernels do not read the sink, so decode steps take "
                               "the PyTorch path", self.sink_tokens)
            elif self.kernels is not None:
                self.decode_kernel, self.tiles_kernel = self.kernels.decode, self.kernels.tiles
                if self.kernels.compress is not None:
                    self.compress = self._compress_kernel
        # a windowed format's decode steps on the PyTorch path read every sequence at once (`_attend_windows`), but
        # a sink or saliency only sequence by sequence
        self.windows_at_once = not self.sink_tokens and self.window_attn is None
        # the blocks prompt chunks fill: on CUDA compressed at commit with every layer's, since each compression call
        # waits for the host (its Rayleigh-Ritz eigh; H200: 48 blocks in one call 4.6 ms, 1,536 in 12 calls 28 ms, a
        # 32k prefill's 192 calls 1.04 s); on the CPU as each layer writes them, where the larger batch was slower
        # (journal 2026-12-05 15c)
        self.defer_prompt_blocks = on_cuda

    def _encode_blocks(self, blocks: list[tuple[int, int, int, torch.Tensor, torch.Tensor]]):
        """Compress full blocks, each (layer, block id, first position, k [T, H, D], v), with the format's encode.
        Looked up on each call, not bound once: the quality harness wraps the format's `encode_blocks` after the
        cache exists (backend.evaluate.memoize_decode)."""
        self.format.encode_blocks(blocks)

    COMPRESS_CHUNK = 128  # blocks per compression call: bounds its temporaries (~2 MB per block at head_dim 128)

    def _compress_kernel(self, blocks: list[tuple[int, int, int, torch.Tensor, torch.Tensor]]):
        """`_encode_blocks` with the format's compression kernel (ALR-KVD: kernels/alrkvd_compress.py, through
        `encode_with_kernel`): one basis decomposition for up to COMPRESS_CHUNK blocks of a prefill chunk, or of
        every layer of a decode step (`compress_blocks`: the kernel's call, or backend/cuda_graphs.py
        `CompressGraphs`)."""
        for i in range(0, len(blocks), self.COMPRESS_CHUNK):
            layers, ids, starts, ks, vs = zip(*blocks[i:i + self.COMPRESS_CHUNK])
            self.compress_blocks(list(layers), list(ids), torch.stack(ks), torch.stack(vs), start_pos=list(starts))

    def _compress_filled(self):
        """Compress the blocks that the step's layers filled (decodes' read from the window until now; prompt
        chunks' copied from it, `defer_prompt_blocks`), all layers in one call, after the step's forward. (On a
        side stream it gained nothing: the basis solve's eigh waits for the host, which waits for the stream;
        journal 2026-11-30 2b, 2026-12-04, 2026-12-06.)"""
        blocks, self._filled = self._filled, []
        if blocks:
            self.compress(blocks)

    # ---- window runs: a prompt chunk across blocks in one graph step ----------------------------------------
    def add_window_runs(self, rows: int, runs: int = 2):
        """Room for `runs` prompt chunks of up to `rows` rows across blocks in a step that reads every row as a
        decode (CUDA graphs): each a run of consecutive window slots, one per block the chunk touches, which the
        decode kernel reads as one window after the row's closed blocks (its `closed`). For windowed formats whose
        decode kernel takes `closed` (ALR-KVD). The slots come on top of the budget (two runs of five slots: 31 MB
        for Qwen3-30B-A3B's 48 layers) and count in `allocated_bytes`."""
        blocks = -(-(rows - 1) // self.block_size) + 1
        if (not self.windowed or self.decode_kernel is None or blocks <= 1 or len(self.window_runs) >= runs
                or "closed" not in inspect.signature(self.decode_kernel).parameters):
            return
        assert not self.window_runs and self.window_k.shape[1] == self.num_sequence_slots
        extra = torch.zeros((self.cfg.num_layers, runs * blocks, *self.window_k.shape[2:]), dtype=self.window_k.dtype,
                            device=self.window_k.device)
        self.window_k, self.window_v = (torch.cat([w, extra], dim=1) for w in (self.window_k, self.window_v))
        self.window_runs = [self.num_sequence_slots + i * blocks for i in range(runs)]
        self.run_blocks = blocks

    def release_runs(self, keep: list[SeqKV] = ()):
        """Before a step is planned: no chunk holds a run but those of `keep` (layered chunks part-way through the
        layers: their rows' keys and values of the layers done are in it)."""
        self._runs = {id(seq): self._runs[id(seq)] for seq in keep if id(seq) in self._runs}

    def take_run(self, seq: SeqKV, num_new: int):
        """A chunk of `num_new` tokens across its block's end: its rows go to a free run that holds them, which
        first gets the window's tokens of the sequence. None free, or the chunk longer than a run (`piecewise_graphs`
        does not cut chunks to `mixed_chunk_limit`): the chunk takes none, and its step's attention runs eagerly."""
        off = seq.num_tokens % self.block_size
        free = [r for r in self.window_runs if r not in self._runs.values()]
        if not free or num_new <= self.block_size - off or num_new > self.run_blocks * self.block_size - off:
            return
        first = free[0]
        self._runs[id(seq)] = first
        if off:
            self._copy_window(seq.window_slot, first, off)

    def _copy_window(self, src: int, dst: int, tokens: int):
        """The first `tokens` of window slot `src` into slot `dst`, keys and values of every layer."""
        for window in (self.window_k, self.window_v):
            window[:, dst, :tokens] = window[:, src, :tokens]

    # ---- allocation -------------------------------------------------------------------
    def blocks_needed(self, seq: SeqKV, num_new: int) -> int:
        total = -(-(seq.num_tokens + num_new) // self.block_size)
        return max(0, total - len(seq.block_table))

    def closing_waits_on_host(self, seq: SeqKV) -> bool:
        """A decode of `seq`'s next token fills its block, whose compression at `commit` waits on the host for the
        device (`KVFormat.encode_waits_on_host`)."""
        return self.format.encode_waits_on_host and (seq.num_tokens + 1) % self.block_size == 0

    def can_allocate(self, seq: SeqKV, num_new: int, reserve: int = 0) -> bool:
        if self.windowed and seq.window_slot is None and not self.free_slots:
            return False
        return self.blocks_needed(seq, num_new) + reserve <= self.allocator.num_free

    def allocate(self, seq: SeqKV, num_new: int):
        """Reserve room for `num_new` more tokens of `seq` (before the forward that writes them)."""
        if self.windowed and seq.window_slot is None:
            if not self.free_slots:
                raise MemoryError("KV cache out of window slots")
            seq.window_slot = self.free_slots.pop()
        seq.block_table += self.allocator.allocate(self.blocks_needed(seq, num_new))

    def free(self, seq: SeqKV):
        self.allocator.free(seq.block_table)
        if seq.window_slot is not None:
            self.free_slots.append(seq.window_slot)
        seq.block_table, seq.num_tokens, seq.window_slot, seq.num_keyed_blocks = [], 0, None, 0

    # ---- prefix caching -----------------------------------------------------------------
    # A block that a sequence's tokens fill is known by its prefix hash (`cache_blocks`); a new sequence whose first
    # tokens are the same takes those blocks instead of computing them (`match_prefix`), as vLLM's automatic prefix
    # caching does: a chat's next turn repeats its history. Blocks no sequence holds stay cached until their room is
    # needed, so a cache that holds more tokens (a compressed format) keeps more histories.
    def match_prefix(self, seq: SeqKV, ids: list[int]) -> int:
        """A sequence with nothing cached takes the cached blocks of its first tokens, whole blocks in order as far
        as they match, never its last token (whose logits it needs). Returns the tokens it need not compute."""
        if not self.prefix_caching or seq.block_table:
            return 0
        for i in range((len(ids) - 1) // self.block_size):
            block = self.allocator.by_hash.get(self._prefix_key(seq, ids, i))
            if block is None:
                break
            self.allocator.hold(block)
            seq.block_table.append(block)
        seq.num_keyed_blocks = len(seq.block_table)
        seq.num_tokens = len(seq.block_table) * self.block_size
        return seq.num_tokens

    def cache_blocks(self, seq: SeqKV, ids: list[int]):
        """After a step: the blocks that `seq`'s tokens `ids` have filled are known by their prefix hash."""
        if not self.prefix_caching:
            return
        full = seq.num_tokens // self.block_size
        for i in range(seq.num_keyed_blocks, full):
            self.allocator.cache(seq.block_table[i], self._prefix_key(seq, ids, i))
        seq.num_keyed_blocks = max(seq.num_keyed_blocks, full)

    def _prefix_key(self, seq: SeqKV, ids: list[int], i: int) -> bytes:
        """The prefix hash of block `i` of `seq`'s tokens `ids`, computed once (a waiting request is matched anew
        at every step that does not admit it)."""
        bs, keys = self.block_size, seq.prefix_keys
        while len(keys) <= i:
            j = len(keys)
            keys.append(prefix_hash(keys[-1] if keys else None, ids[j * bs:(j + 1) * bs]))
        return keys[i]

    def commit(self, batch: AttentionBatch):
        """After a forward step: the step's tokens are now part of each sequence's cache, and the blocks
        the kernel path's rows filled (decodes, a graph's prompt chunks), read from the window during the step, are
        compressed, every layer's, with those of eager prompt chunks where `defer_prompt_blocks` (else each layer
        compressed them as it wrote them)."""
        # rows read from the windows: the step's, or an eager step's decodes beside its prompt chunks (`decodes_apart`)
        parts = [batch] + ([batch.decodes[1]] if batch.decodes else [])
        for part in parts:
            if part.decode_meta is None or not self.windowed:
                continue
            for i, pos, slot in part.decode_meta["closing"]:
                seq = part.seqs[i]
                start = pos + 1 - self.block_size
                block = seq.block_table[start // self.block_size]
                # the layers' views in one call each: indexing them one by one took 0.8 ms of host time for a
                # step's two blocks on the H100, the GPU idle meanwhile (journal 2026-12-07 36b)
                ks, vs = self.window_k[:, slot].unbind(0), self.window_v[:, slot].unbind(0)
                self._filled += [(layer, block, start, ks[layer], vs[layer]) for layer in range(self.cfg.num_layers)]
            for i, slot, tail in part.decode_meta.get("run_tails", []):  # (read, not compressed: no wait)
                self._copy_window(slot, part.seqs[i].window_slot, tail)
        for seq, n in zip(batch.seqs, batch.query_lens):
            seq.num_tokens += n
        self._compress_filled()

    # ---- storage ----------------------------------------------------------------------
    # The most decoded history (keys and values of closed blocks) a step keeps for the layers ahead: the PyTorch path
    # decodes a sequence's closed blocks for as many layers as fit, at once (`_closed_history`). SmolLM2 on the CPU,
    # 2 MB: batch 1 at 200 tokens 35.2 ms a step against 47.9 one layer at a time, batch 8 at 100 tokens 76.3 against
    # 96.6; larger groups lost where each layer's history is large (4 MB, batch 1 at 1,024 tokens: 115.5 against 93.0
    # ms; a history out of cache by the time its layer reads it; journal 2026-12-05 21b)
    HISTORY_BYTES = 2 << 20

    def _closed_history(self, layer: int, ids, start_pos, store: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """`format.decode(layer, ids, start_pos)`, from `store` (one step's, for these blocks): on a layer it lacks,
        decoded for that layer and the next ones, as many as `HISTORY_BYTES` holds (a closed block is the same
        in every layer; each decode operation costs ~10 us of overhead on the CPU whatever its size)."""
        if layer not in store:
            per_layer = dense_kv_bytes(self.cfg, len(ids) * self.block_size, self.dtype.itemsize) // self.cfg.num_layers
            group = range(layer, min(layer + max(1, self.HISTORY_BYTES // max(per_layer, 1)), self.cfg.num_layers))
            k, v = self.format.decode_layers(group, ids, start_pos)
            store.clear()
            store.update({at: (k[i], v[i]) for i, at in enumerate(group)})
        return store[layer]

    def read(self, layer: int, seq: SeqKV, length: int | None = None,
             history: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (rotated) and values of the first `length` cached tokens of `seq`: [P, Hkv, D]. `history`: the
        step's store of `seq`'s decoded closed blocks (`_closed_history`)."""
        P = seq.num_tokens if length is None else length
        bs = self.block_size
        if not self.windowed:
            k, v = self.format.decode(layer, seq.block_table[:-(-P // bs)])
            return self._rope_on_read(k[:P], 0), v[:P]
        closed, in_window = divmod(P, bs)
        if self.use_triton and self.kernels is not None and self.kernels.rebuild is not None:
            # the closed blocks rebuilt in one launch, keys already rotated: only the window's need RoPE (no sink:
            # the kernels are off with one)
            ids = torch.tensor(seq.block_table[:closed], dtype=torch.int32).to(self.device, non_blocking=True)
            k, v = self.kernels.rebuild(self.kernel_layers[layer], ids, self.rotary.cos, self.rotary.sin, self.dtype)
        else:
            k, v = (self.format.decode(layer, seq.block_table[:closed]) if history is None or not closed
                    else self._closed_history(layer, seq.block_table[:closed], 0, history))
            if closed and self.sink_tokens:
                n = self.sink_tokens
                k = torch.cat([self.sink_k[layer, seq.window_slot], k[n:]])
                v = torch.cat([self.sink_v[layer, seq.window_slot], v[n:]])
            k = self._rope_on_read(k, 0)
        if in_window:
            wk, wv = (w[layer, seq.window_slot, :in_window] for w in (self.window_k, self.window_v))
            k, v = torch.cat([k, self._rope_on_read(wk, closed * bs)]), torch.cat([v, wv])
        return k, v

    def _rope_on_read(self, k: torch.Tensor, first: int) -> torch.Tensor:
        """Keys of positions first.. as attention reads them: rotated where the format keeps them before RoPE
        (`rope_on_read`; the tables' rows first.., no gather)."""
        if not self.rope_on_read:
            return k
        tables = (self.rotary.cos, self.rotary.signed_sin)
        return self.rotary.rotate(k, *(t[first:first + k.shape[0], None].to(k.dtype) for t in tables))

    def write(self, layer: int, seq: SeqKV, k: torch.Tensor, v: torch.Tensor, received: torch.Tensor | None = None):
        """Append keys (in the format's convention: rotated or not) and values after the cached tokens.
        ``received`` [n, Hkv]: the attention the new tokens received in this step (formats that want
        saliency: a closing block goes to the format with each token's mean over the queries that saw it)."""
        bs, start, n = self.block_size, seq.num_tokens, k.shape[0]
        if not self.windowed:
            pos = torch.arange(start, start + n)
            table = torch.tensor(seq.block_table, dtype=torch.long)
            self.format.write(layer, table[pos // bs].to(k.device), (pos % bs).to(k.device), k, v)
            return
        done, full = 0, []
        while done < n:
            pos = start + done
            off = pos % bs
            m = min(n - done, bs - off)
            whole = (n - done) // bs if off == 0 and received is None and (pos or not self.sink_tokens) else 0
            if whole:  # blocks the chunk fills alone: copied from its rows at once, not through the window
                ks, vs = (x[done:done + whole * bs].unflatten(0, (whole, bs)).to(self.window_k.dtype, copy=True)
                          .unbind() for x in (k, v))
                full += [(layer, seq.block_table[pos // bs + i], pos + i * bs, ks[i], vs[i]) for i in range(whole)]
                done += whole * bs
                continue
            self.window_k[layer, seq.window_slot, off:off + m] = k[done:done + m]
            self.window_v[layer, seq.window_slot, off:off + m] = v[done:done + m]
            if received is not None:
                self.window_attn[layer, seq.window_slot, off:off + m] = received[done:done + m]
            if off + m == bs:  # the block is full (a copy: the window takes the next block's tokens)
                if pos - off == 0 and self.sink_tokens:  # the sequence's first block: its sink stays exact
                    self.sink_k[layer, seq.window_slot] = self.window_k[layer, seq.window_slot, :self.sink_tokens]
                    self.sink_v[layer, seq.window_slot] = self.window_v[layer, seq.window_slot, :self.sink_tokens]
                block = (layer, seq.block_table[pos // bs], pos - off,
                         self.window_k[layer, seq.window_slot].clone(), self.window_v[layer, seq.window_slot].clone())
                if received is not None:  # every query of this step has attended: start + n - t saw token t
                    seen = start + n - torch.arange(pos - off, pos - off + bs, device=k.device)
                    block += (self.window_attn[layer, seq.window_slot] / seen[:, None],)
                full.append(block)
            done += m
        if full and self.defer_prompt_blocks and received is None:
            self._filled += full  # copies of the window: compressed at commit (`_compress_filled`)
        elif full:
            self.compress(full)

    # ---- attention ----------------------------------------------------------------------
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, k_rot: torch.Tensor, v: torch.Tensor,
               batch: AttentionBatch) -> torch.Tensor:
        """q [T, Hq, D] (rotated), k / k_rot [T, Hkv, D] before / after RoPE, v. Returns [T, Hq, D].
        Decode-only steps attend for all sequences at once, as do steps with prompt chunks where the tiles kernel
        runs (page-addressed formats on the kernel path); elsewhere prompt chunks go sequence by sequence (beside
        them, a windowed format's decodes go all at once: `decodes_apart`), as does a windowed format on the
        PyTorch path with one sequence (no padding, no mask) or `windows_at_once` off."""
        k_store = k if self.rope_on_read else k_rot  # what the format keeps
        decode_only = all(n == 1 for n in batch.query_lens)
        if batch.decode_meta is None and not decode_only and self.use_triton and self.tiles_kernel is not None:
            # prompt chunks through the tiles kernel: every row causal over the paged cache, all sequences in one
            # launch a layer (no copy of the history, no mask)
            batch.decode_meta = self.build_decode_meta(
                batch, num_tiles=self.num_tiles(sum(batch.query_lens), len(batch.seqs)))
        one_by_one = self.windowed and self.decode_kernel is None and (len(batch.seqs) == 1 or not self.windows_at_once)
        if batch.decode_meta is not None or (decode_only and not one_by_one):
            return self._attend_decode(layer, q, k_store, k_rot, v, batch)
        out = torch.empty_like(q)
        apart = self.decodes_apart(batch)
        if apart is not None:  # the decodes all at once; only the prompt chunks one by one
            rows, decodes = apart
            out[rows] = self._attend_decode(layer, q[rows], k_store[rows], k_rot[rows], v[rows], decodes)
        start = 0
        for seq, n in zip(batch.seqs, batch.query_lens):
            if apart is not None and n == 1:
                start += 1
                continue
            P = seq.num_tokens
            k_new, v_new = k_rot[start:start + n], v[start:start + n]
            k_past, v_past = self.read(layer, seq, history=batch.history.setdefault(id(seq), {}))
            keys = torch.cat([k_past, k_new]).transpose(0, 1)      # [Hkv, P+n, D]
            values = torch.cat([v_past, v_new]).transpose(0, 1)
            # query i sees the past and the new tokens up to itself: causal aligned to the last key, which SDPA
            # runs as flash attention on CUDA (GQA kept, no mask; a bool mask with GQA there takes the math path
            # and holds every score in fp32), and as the mask elsewhere. A batch dim of 1: on the CPU, SDPA with
            # enable_gqa takes its slow math path for 3-D inputs (5x)
            causal = causal_lower_right(n, P + n) if n > 1 else None
            o = F.scaled_dot_product_attention(q[start:start + n].transpose(0, 1)[None], keys[None], values[None],
                                               attn_mask=causal, enable_gqa=True)
            out[start:start + n] = o[0].transpose(0, 1)
            received = None
            if self.window_attn is not None:  # per kv head, the mean over its query heads, summed over queries
                mask = torch.ones(n, P + n, dtype=torch.bool, device=q.device).tril(diagonal=P) if n > 1 else None
                p = attention_probs(q[start:start + n], keys, mask)                    # [Hq, n, P + n]
                received = p.sum(1).view(keys.shape[0], -1, P + n).mean(1).t()          # [P + n, Hkv]
                old = P % self.block_size  # tokens already in the window
                self.window_attn[layer, seq.window_slot, :old] += received[P - old:P]
                received = received[P:]
            self.write(layer, seq, k_store[start:start + n], v_new, received)
            start += n
        return out

    def decodes_apart(self, batch: AttentionBatch) -> tuple[torch.Tensor, AttentionBatch] | None:
        """An eager step's decode rows and a batch of their sequences, where prompt chunks ride beside them in a
        windowed format: read by its decode kernel from the compressed blocks, or on the PyTorch path (two or more,
        `windows_at_once`) decoded together in one call (`_attend_windows`), not one sequence at a time. None
        otherwise."""
        if not self.windowed or (self.decode_kernel is None and not self.windows_at_once):
            return None
        if batch.decodes is None:
            starts = list(itertools.accumulate(batch.query_lens, initial=0))[:-1]
            rows = [r for r, n in zip(starts, batch.query_lens) if n == 1]
            if len(rows) < (1 if self.decode_kernel is not None else 2):
                return None
            seqs = [s for s, n in zip(batch.seqs, batch.query_lens) if n == 1]
            batch.decodes = (torch.tensor(rows, device=self.device), AttentionBatch(seqs, [1] * len(seqs)))
        return batch.decodes

    def mixed_rows_supported(self) -> bool:
        """Whether steps with prompt chunks can attend through `build_decode_meta`'s rows (each row causal by
        its own length, the step's keys written first): page-addressed formats with the tiles kernel; windowed
        formats with a decode kernel, each row read as a decode (chunks end at their block's end:
        `mixed_chunk_limit`), except with attention sinks or saliency, which the kernels do not keep."""
        if self.windowed:
            return self.decode_kernel is not None and self.window_attn is None and not self.sink_tokens
        return self.tiles_kernel is not None

    def mixed_chunk_limit(self, seq: SeqKV, taking: bool = True) -> int:
        """The most prompt tokens of `seq` such a step takes: a windowed format holds a sequence's newest block
        in its window slot, so the chunk ends where that block does (it closes at commit), or where the run of
        slots it holds or, `taking` (the scheduler, before `take_run`), can take does. A step's runner asks with
        `taking=False`: a chunk that took no run (a step without decodes takes none) must end in its block."""
        if not self.windowed:
            return 1 << 30
        free = taking and len(self._runs) < len(self.window_runs)
        blocks = self.run_blocks if id(seq) in self._runs or free else 1
        return blocks * self.block_size - seq.num_tokens % self.block_size

    def history_reads(self, batch: AttentionBatch) -> int:
        """Tokens of compressed history that a step's prompt rows read through a windowed format's decode kernel
        (`mixed_rows_supported`): each row of a chunk reads the blocks closed before its chunk. 0 for page-addressed
        formats (their tiles kernel reads a history once per tile, at fp16's speed)."""
        return sum(n * self.closed_history(seq) for seq, n in zip(batch.seqs, batch.query_lens) if n > 1)

    def closed_history(self, seq: SeqKV) -> int:
        """Tokens of `seq`'s compressed history that each of its next prompt rows reads through a windowed format's
        decode kernel: its closed blocks' (0 for page-addressed formats)."""
        return seq.num_tokens // self.block_size * self.block_size if self.windowed else 0

    def new_prompt_chunks(self, tokens: int) -> list[int]:
        """How such a step takes `tokens` prompt tokens of sequences that start at a block's start: one chunk,
        or (windowed formats) chunks of a block each."""
        bs = self.block_size
        return [bs] * (tokens // bs) + [tokens % bs] * (tokens % bs > 0) if self.windowed else [tokens]

    @property
    def tile_rows(self) -> int:
        """Query rows per tile where a step's rows attend in tiles: the tiles kernel's, or a windowed format's decode
        kernel's that reads a prompt chunk's rows so (`FormatKernels.tile_rows`); 0: row by row."""
        if self.tiles_kernel is not None:
            from kernels.paged_attention import tile_tokens
            return tile_tokens(self.cfg.num_heads // self.cfg.num_kv_heads)
        if self.decode_kernel is not None and self.kernels.tile_rows is not None:
            return self.kernels.tile_rows(self.kernel_layers[0], self.cfg.num_heads, torch.device(self.device))
        return 0

    def num_tiles(self, rows: int, num_seqs: int) -> int:
        """The most query tiles a step of `rows` rows over at most `num_seqs` sequences (and padding) needs;
        0 where rows are read one by one (`tile_rows`)."""
        return rows // self.tile_rows + num_seqs + 2 if self.tile_rows else 0

    def build_decode_meta(self, batch: AttentionBatch, static: dict | None = None,
                          pad: tuple[int, int, int] = (0, 0, 0), num_tiles: int = 0, rows_apart: int = 0) -> dict:
        """Per query row (a decode's token, or each token of a prompt chunk), built once and shared by every
        layer: the block and offset (windowed: window slot and offset) it writes, its sequence's block table
        and the tokens it sees; with `num_tiles`, the rows' tiles (`tiles_kernel`; unused ones have count 0),
        but for a windowed format's first `rows_apart` rows, which its decode kernel reads one by one.
        `static`: device buffers of `decode_buffers` to copy them into (a CUDA graph reads the same memory
        every step). `pad`: (rows, block, window slot): that many more rows, which write into and read that
        scratch block or slot only (a graph's fixed size)."""
        dev, bs = self.device, self.block_size
        pad_rows, pad_block, pad_slot = pad
        query_lens = list(batch.query_lens) + ([pad_rows] if pad_rows else [])
        first = [s.num_tokens for s in batch.seqs] + [0]
        pos = torch.cat([torch.arange(p, p + n) for p, n in zip(first, query_lens)])
        seq_of_row = torch.repeat_interleave(torch.arange(len(query_lens)), torch.tensor(query_lens))
        width = max(len(s.block_table) for s in batch.seqs)
        tables = np.zeros((len(batch.seqs) + 1, width), dtype=np.int32)
        for i, s in enumerate(batch.seqs):
            row = s.table_row()
            tables[i, :len(row)] = row
        tables[-1] = pad_block  # (the padding rows')
        tables = torch.from_numpy(tables)[seq_of_row]
        if pad_rows:  # every padding row writes and reads the scratch block's first token
            pos[-pad_rows:] = 0
        # a row's window: its sequence's slot, or the first slot of the run its chunk took (`take_run`), whose
        # slots hold the chunk's blocks in turn after the blocks closed before it (`closed`)
        runs = [self._runs.get(id(s)) for s in batch.seqs]
        slots = torch.tensor([(s.window_slot or 0) if r is None else r for s, r in zip(batch.seqs, runs)] + [pad_slot],
                             dtype=torch.int32)
        closed = pos // bs
        host = {"block_ids": tables[torch.arange(len(pos)), closed].long(), "offsets": pos % bs,
                "tables": tables, "seq_lens": (pos + 1).to(torch.int32), "window_slots": slots[seq_of_row]}
        host["window_rows"] = host["window_slots"].long()
        if any(r is not None for r in runs):
            in_run = torch.tensor([r is not None for r in runs] + [False])[seq_of_row]
            chunk_first = torch.tensor(first)[seq_of_row] // bs
            host["window_rows"] += torch.where(in_run, closed - chunk_first, 0)
            closed = torch.where(in_run, chunk_first, closed)
        if any(n > 1 for n in batch.query_lens) and self.window_runs:  # the kernel takes each row's closed blocks
            host["closed"] = closed.to(torch.int32)
        rows_apart = min(rows_apart, len(pos)) if self.windowed and num_tiles else 0
        if rows_apart == len(pos):  # every row apart: no tiles, one launch reads them one by one
            num_tiles = rows_apart = 0
        if num_tiles:
            from kernels.paged_attention import query_tiles
            starts, counts = query_tiles(query_lens, self.tile_rows, first_row=rows_apart)
            assert len(starts) <= num_tiles, (len(starts), num_tiles)
            unused = [0] * (num_tiles - len(starts))
            host["tile_starts"] = torch.tensor(starts + unused, dtype=torch.int32)
            host["tile_counts"] = torch.tensor(counts + unused, dtype=torch.int32)
        if static is None:
            meta = {k: v.to(dev) for k, v in host.items()}
        else:  # the rows of this batch; table columns past its widest sequence are never read
            meta = {k: static[k][:len(v)] for k, v in host.items()}
            for k, v in host.items():
                queued_copy(meta[k][:, :width] if k == "tables" else meta[k], v)
        meta["window_index"] = (meta["window_rows"], meta["offsets"])
        meta["rows_apart"] = rows_apart
        real_rows = len(pos) - pad_rows  # (sequence, position, window slot) of the rows whose token fills a block
        rows_of = zip(seq_of_row[:real_rows].tolist(), pos[:real_rows].tolist(),
                      host["window_rows"][:real_rows].tolist())
        meta["closing"] = [(s, p, slot) for s, p, slot in rows_of if (p + 1) % bs == 0]
        # a run's last block, unless full: back to its sequence's slot after the step
        ends = itertools.accumulate(batch.query_lens)
        meta["run_tails"] = [(i, int(host["window_rows"][end - 1]), (first[i] + n) % bs)
                             for i, (n, end, run) in enumerate(zip(batch.query_lens, ends, runs))
                             if run is not None and (first[i] + n) % bs]
        if self.decode_kernel is None and not self.windowed:  # the PyTorch path pads every sequence to the longest
            meta["mask"] = (torch.arange(width * bs) <= pos[:, None]).view(len(pos), 1, 1, -1).to(dev)
        elif self.decode_kernel is None:
            meta.update(self._window_plan(batch.seqs))
        return meta

    def _window_plan(self, seqs: list[SeqKV]) -> dict:
        """How a windowed format's PyTorch decode step reads every sequence at once (`_attend_windows`): the
        compressed blocks of all of them decoded in one call, each placed in a [B, W + 1] grid of blocks (W: the
        most a sequence has; block W: its window, which holds the step's token), with each place's position (RoPE)
        and whether it is a token of the sequence."""
        bs, dev = self.block_size, self.device
        closed = [s.num_tokens // bs for s in seqs]  # the blocks before the one the step's token goes into
        W = max(closed)
        ids = [b for s, c in zip(seqs, closed) for b in s.block_table[:c]]
        grid_rows = [i * (W + 1) + j for i, c in enumerate(closed) for j in range(c)]
        first = torch.tensor(closed)[:, None] * bs      # a window's first position
        place = torch.arange((W + 1) * bs)
        positions = torch.where(place < W * bs, place, first + place - W * bs)
        tokens = torch.tensor([s.num_tokens + 1 for s in seqs])[:, None]
        valid = torch.where(place < W * bs, place < first, positions < tokens)
        return {"closed_ids": torch.tensor(ids, dtype=torch.long), "closed_starts": torch.tensor(
                    [j * bs for c in closed for j in range(c)], dtype=torch.long, device=dev),
                "grid_rows": torch.tensor(grid_rows, dtype=torch.long, device=dev),
                "positions": positions.to(dev), "valid": valid.view(len(seqs), 1, 1, -1).to(dev)}

    def _attend_windows(self, layer: int, q: torch.Tensor, meta: dict) -> torch.Tensor:
        """A windowed format's decode step on the PyTorch path (the step's keys already in the windows): every
        sequence's compressed blocks decoded in one call, padded beside its window, one masked SDPA."""
        B, H, D, bs = q.shape[0], self.cfg.num_kv_heads, self.cfg.head_dim, self.block_size
        W = meta["positions"].shape[1] // bs - 1
        padded = meta["grid_rows"].numel() < B * W  # places no token fills: zeros (masked, but never NaN)
        grid = [(torch.zeros if padded else torch.empty)(B * (W + 1), bs, H, D, dtype=self.dtype, device=self.device)
                for _ in range(2)]
        if W:
            decoded = self._closed_history(layer, meta["closed_ids"], meta["closed_starts"],
                                           meta.setdefault("history", {}))
            for g, x in zip(grid, decoded):
                g[meta["grid_rows"]] = x.view(-1, bs, H, D)
        slots = meta["window_rows"]
        keys, values = (g.view(B, W + 1, bs, H, D) for g in grid)
        keys[:, W], values[:, W] = self.window_k[layer, slots], self.window_v[layer, slots]
        keys, values = keys.view(B, -1, H, D), values.view(B, -1, H, D)
        if self.rope_on_read:
            pos = meta["positions"]
            keys = self.rotary.rotate(keys, self.rotary.cos[pos][:, :, None].to(keys.dtype),
                                      self.rotary.signed_sin[pos][:, :, None].to(keys.dtype))
        o = F.scaled_dot_product_attention(q.unsqueeze(2), keys.transpose(1, 2), values.transpose(1, 2),
                                           attn_mask=meta["valid"], enable_gqa=True)
        return o.squeeze(2)

    def decode_buffers(self, max_rows: int, max_len: int, max_tiles: int = 0) -> dict:
        """Static device buffers for `build_decode_meta` of up to `max_rows` query rows (and sequences) of up to
        `max_len` tokens, in up to `max_tiles` tiles."""
        z = lambda *shape, dtype=torch.long: torch.zeros(shape, dtype=dtype, device=self.device)  # noqa: E731
        return {"block_ids": z(max_rows), "offsets": z(max_rows),
                "tables": z(max_rows, -(-max_len // self.block_size), dtype=torch.int32),
                "seq_lens": z(max_rows, dtype=torch.int32), "window_slots": z(max_rows, dtype=torch.int32),
                "window_rows": z(max_rows), "closed": z(max_rows, dtype=torch.int32),
                "tile_starts": z(max_tiles, dtype=torch.int32),
                "tile_counts": z(max_tiles, dtype=torch.int32)}

    def _attend_decode(self, layer, q, k_store, k_rot, v, batch: AttentionBatch) -> torch.Tensor:
        """Query rows (one new token per sequence, or a graph step's prompt chunks too): write all of them at
        once, then attend over the paged cache (the fused Triton kernels on CUDA; gather + masked SDPA
        elsewhere)."""
        meta = batch.decode_meta = batch.decode_meta or self.build_decode_meta(batch)
        scale = q.shape[-1] ** -0.5
        if self.windowed:  # ALR-KVD or KIVI kernel: every new token into its window slot, then attend; the
            # blocks this step fills are read from the window and compressed at commit (all layers at once)
            self.store_kv(k_store, v, self.window_k[layer], self.window_v[layer], *meta["window_index"])
            if self.decode_kernel is None:
                return self._attend_windows(layer, q, meta)
            rope = (self.rotary.cos, self.rotary.sin) if self.rope_on_read else ()  # keys kept before RoPE
            # steps with prompt rows: each row's closed blocks (runs), and the rows in tiles of a sequence's rows
            rows = {k: meta[k] for k in ("closed", "tile_starts", "tile_counts") if k in meta}
            if "tile_starts" in rows:
                q = q.contiguous()  # rows as heads of [rows x Hq]
            inputs = (self.kernel_layers[layer], self.window_k[layer], self.window_v[layer])
            apart = meta["rows_apart"]
            out = self.decode_kernel(q, *inputs, meta["tables"], meta["seq_lens"], meta["window_slots"], *rope,
                                     scale, **rows)
            if apart:  # the leading rows, which no tile holds, one by one
                closed = {"closed": rows["closed"][:apart]} if "closed" in rows else {}
                out[:apart] = self.decode_kernel(q[:apart], *inputs, meta["tables"][:apart], meta["seq_lens"][:apart],
                                                 meta["window_slots"][:apart], *rope, scale, **closed)
            return out
        if self.use_triton and self.kernels is not None and self.kernels.stores_as_is:  # kept as they come
            self.store_kv(k_rot, v, *self.kernel_layers[layer], meta["block_ids"], meta["offsets"])
        else:
            self.format.write(layer, meta["block_ids"], meta["offsets"], k_rot, v)
        if self.tiles_kernel is not None and "tile_starts" in meta:  # a step with prompt chunks: causal rows
            k_cache, v_cache = self.kernel_layers[layer]
            return self.tiles_kernel(q, k_cache, v_cache, meta["tables"], meta["seq_lens"], meta["tile_starts"],
                                     meta["tile_counts"], scale)
        if self.decode_kernel is not None:
            k_cache, v_cache = self.kernel_layers[layer]
            return self.decode_kernel(q, k_cache, v_cache, meta["tables"], meta["seq_lens"], scale)
        B, width = meta["tables"].shape
        keys, values = self.format.decode(layer, meta["tables"].flatten())  # [B * width * bs, Hkv, D]
        keys = keys.view(B, -1, *keys.shape[1:]).transpose(1, 2)            # [B, Hkv, width * bs, D]
        values = values.view(B, -1, *values.shape[1:]).transpose(1, 2)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=meta["mask"], enable_gqa=True)
        return o.squeeze(2)

    # ---- accounting -------------------------------------------------------------------
    def allocated_bytes(self) -> int:
        attn = 0 if self.window_attn is None else self.window_attn.numel() * self.window_attn.element_size()
        return sum(t.numel() * t.element_size() for t in self.format.tensors()) + attn + \
            sum(t.numel() * t.element_size() for t in (self.window_k, self.window_v, self.sink_k, self.sink_v))

    def used_bytes(self) -> int:
        used_blocks = self.allocator.num_blocks - self.allocator.num_free
        used_slots = (self.num_sequence_slots - 1 - len(self.free_slots)) if self.windowed else 0
        return used_blocks * self.block_bytes + used_slots * self.slot_bytes

    def baseline_bytes_per_token(self) -> int:
        """What a 16-bit cache stores per token: the serving baseline for compression ratios."""
        return dense_kv_bytes(self.cfg, 1, 2)

    def stats(self) -> dict:
        return {
            "kv_format": self.kv_format,
            "kv_blocks_total": self.allocator.num_blocks,
            "kv_blocks_used": self.allocator.num_blocks - self.allocator.num_free,
            "kv_bytes_used": self.used_bytes(),
            "kv_bytes_allocated": self.allocated_bytes(),
            "kv_block_bytes": self.block_bytes,
            "kv_block_size": self.block_size,
            "baseline_bytes_per_token": self.baseline_bytes_per_token(),
        }
