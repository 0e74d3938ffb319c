"""The base of the KV formats: fixed-size storage per (layer, block), its accounting, the data path the
paged cache calls (`write` for page-addressed formats, `encode` / `encode_blocks` for windowed ones, `decode`,
`roundtrip`), and the Triton kernels that read and write the storage (`kernels`)."""
from __future__ import annotations

import logging
from typing import Any, Callable, NamedTuple

import torch

from backend.kv_formats.codecs import parse_options

logger = logging.getLogger(__name__)


class FormatKernels(NamedTuple):
    """The Triton kernels (kernels/) of one format's storage, as PagedKVCache calls them (on CUDA, or under the
    interpreter with attention_backend="triton")."""
    decode: Callable             # decode attention over the paged blocks (and the window, for windowed formats)
    layers: list                 # per layer, the storage `decode` reads: (k_cache, v_cache) for page-addressed
                                 # formats, a view object (kernels.*_attention.*Layer) for windowed ones
    compress: Callable | None = None  # windowed formats: full blocks into the storage (the contract of
                                      # ALRKVDFormat.encode_with_kernel); None: the format's encode
    tiles: Callable | None = None     # attention of a step's query rows in tiles, prompt chunks and decodes
                                      # together (kernels.paged_attention.paged_tiles_attention); None: mixed
                                      # steps attend sequence by sequence, outside CUDA graphs
    stores_as_is: bool = False        # page-addressed formats whose `layers` hold keys and values as they come:
                                      # a step's are written with kernels.paged_attention.store_kv
    rebuild: Callable | None = None   # windowed formats: a sequence's closed blocks as dense keys (rotated) and
                                      # values in one launch (kernels.alrkvd_attention.alrkvd_rebuild_blocks); None:
                                      # the format's decode
    tile_rows: Callable | None = None  # windowed formats whose `decode` reads a prompt chunk's rows in tiles
                                       # (`tile_starts`): the most rows a tile holds, of (a `layers` entry, query
                                       # heads, device) (kernels.alrkvd_attention.tile_rows); None: row by row


class KVFormat:
    """Base class.  Subclasses set ``name``, ``windowed``, ``rope_on_read``, ``default_block_size`` and
    ``OPTIONS`` ({name: (parser, default)}), allocate storage with ``self._alloc`` in ``_allocate``."""

    name = "base"
    windowed = False
    rope_on_read = False
    default_block_size = 16
    wants_saliency = False  # True: encode takes each token's saliency (the attention it received in the window)
    encode_waits_on_host = False  # True: compressing a block makes the host wait for the device
    OPTIONS: dict[str, tuple[Callable[[Any], Any], Any]] = {}

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: str | torch.device, num_blocks: int, block_size: int | None = None, **options):
        self.num_layers = int(num_layers)
        self.num_kv_heads = int(num_kv_heads)
        self.head_dim = int(head_dim)
        self.dtype = dtype
        self.device = torch.device(device)
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size or self.default_block_size)
        self.options = parse_options(self.name, self.OPTIONS, options)
        self._tensors: dict[str, torch.Tensor] = {}
        self._validate()
        self._allocate()

    # -- storage ---------------------------------------------------------------------------------------
    def _validate(self) -> None:
        pass

    def _allocate(self) -> None:
        raise NotImplementedError

    def _alloc(self, name: str, shape_per_block: tuple[int, ...], dtype: torch.dtype,
               order: tuple[int, ...] | None = None) -> torch.Tensor:
        """A zeroed [num_layers, num_blocks, *shape_per_block] tensor. `order` lays the per-block dims out in
        memory in that order (outermost first) and returns the view in the logical order: e.g. (1, 0) stores a
        [T, R] block as [R, T], so that a kernel reads one row's T values contiguously."""
        order = order or tuple(range(len(shape_per_block)))
        t = torch.zeros((self.num_layers, self.num_blocks, *(shape_per_block[i] for i in order)), dtype=dtype,
                        device=self.device)
        t = t.permute(0, 1, *(2 + order.index(i) for i in range(len(order))))
        self._tensors[name] = t
        setattr(self, name, t)
        return t

    def tensors(self) -> list[torch.Tensor]:
        return list(self._tensors.values())

    def named_tensors(self) -> dict[str, torch.Tensor]:
        return dict(self._tensors)

    def bytes_per_block(self) -> int:
        """Bytes of one block across all layers (K and V, all metadata)."""
        return sum(t[0, 0].numel() * t.element_size() for t in self._tensors.values()) * self.num_layers

    def bytes_per_token(self) -> float:
        """Bytes per token of a closed block (all layers, K and V, all metadata); no window."""
        return self.bytes_per_block() / self.block_size

    def dense_bytes_per_token(self, dtype: torch.dtype | None = None) -> int:
        """Uncompressed bytes per token in ``dtype`` (default: the model dtype), all layers, K and V."""
        es = torch.empty((), dtype=dtype or self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * es

    def describe(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.name}({opts})" if opts else self.name

    # -- kernels ----------------------------------------------------------------------------------------
    def kernels(self, max_rows: int) -> FormatKernels | None:
        """The Triton kernels that read and write this format's storage, or None: no kernel reads this format,
        or not with these options (the reason is logged). ``max_rows``: the most query rows of a call (a decode
        step's sequences, or a graph step's rows with its prompt chunks).
        The layers are views made on any device; the kernels run on CUDA. Kernel modules are imported here, when
        asked for: Triton decides at import whether a kernel is compiled or interpreted (kernels/testing.py)."""
        return self._no_kernels(f"no kernel reads {self.name}")

    def _no_kernels(self, reason: str) -> None:
        if self.device.type == "cuda":  # elsewhere no kernel runs anyway
            logger.warning("kv format %s: %s; decode attention takes the PyTorch path (slow: every step rebuilds "
                           "the compressed blocks)", self.name, reason)
        return None

    # -- data path --------------------------------------------------------------------------------------
    def write(self, layer: int, block_ids: torch.Tensor, offsets: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        raise NotImplementedError(f"{self.name} is windowed: the cache calls encode() on full blocks")

    def encode(self, layer: int, block_id: int, k: torch.Tensor, v: torch.Tensor, start_pos: int = 0) -> None:
        """Compress one full block (windowed formats). ``start_pos``: the position of its first token."""
        raise NotImplementedError(f"{self.name} is not windowed: the cache calls write()")

    def encode_blocks(self, blocks: list[tuple[int, int, int, torch.Tensor, torch.Tensor]]) -> None:
        """Compress full blocks, each (layer, block id, position of its first token, k [T, H, D], v[, saliency
        [T, H] for formats that ``wants_saliency``]): one ``encode`` each, unless the format batches them (a
        decode step fills one per sequence and layer)."""
        for layer, block_id, start, k, v, *saliency in blocks:
            self.encode(layer, block_id, k, v, start_pos=start, **({"saliency": saliency[0]} if saliency else {}))

    def decode(self, layer: int, block_ids, start_pos=0) -> tuple[torch.Tensor, torch.Tensor]:
        """Reconstruction of the listed blocks, in order: (k, v) each [n * block_size, H, D] in the model
        dtype (keys before RoPE when ``rope_on_read``). ``start_pos``: the first block's position (the rest follow
        it), or each block's (a tensor [n]), for formats that store keys in a position's frame; others ignore it."""
        raise NotImplementedError

    def decode_layers(self, layers: range, block_ids, start_pos=0) -> tuple[torch.Tensor, torch.Tensor]:
        """`decode` of the same blocks in each of `layers`: (k, v) each [len(layers), n * block_size, H, D]. The
        blocks a sequence closed are the same in every layer, so a step can decode several layers' at once."""
        k, v = zip(*(self.decode(layer, block_ids, start_pos) for layer in layers))
        return torch.stack(k), torch.stack(v)

    def roundtrip(self, k: torch.Tensor, v: torch.Tensor, layer: int = 0, block_id: int = 0, **kw):
        """Compress one block [block_size, H, D] into block ``block_id`` and return its reconstruction
        (``kw``: e.g. ``start_pos`` for formats that need the block's position)."""
        if self.windowed:
            self.encode(layer, block_id, k, v, **kw)
            kk, vv = self.decode(layer, [block_id], **kw)
            return kk[: k.shape[0]], vv[: k.shape[0]]
        else:
            n = k.shape[0]
            ids = torch.full((n,), block_id, dtype=torch.long, device=self.device)
            self.write(layer, ids, torch.arange(n, device=self.device), k, v)
        kk, vv = self.decode(layer, [block_id])
        return kk[: k.shape[0]], vv[: k.shape[0]]

    @staticmethod
    def _ids(block_ids, device) -> torch.Tensor:
        return torch.as_tensor(block_ids, dtype=torch.long, device=device).reshape(-1)
