"""Compressed KV-cache formats behind the paged cache (backend/kv_cache.py).

Every format owns fixed-size storage per (layer, block) so that the paged cache can allocate, free and
account blocks uniformly.  Storage tensors all have the leading dims ``[num_layers, num_blocks, ...]``;
``tensors()`` lists every tensor allocated, so ``sum(t.numel() * t.element_size())`` is the exact memory
of the block pool (the cache adds its full-precision window slots on top).  The exact layouts are
documented in docs/ALRKVD.md (kernels depend on them).

Formats
  fp16    the model dtype, uncompressed (non-windowed: ``write``).
  int8    symmetric int8 per (token, head) with an fp16 scale (non-windowed: ``write``).
  kivi2/3/4  KIVI: keys quantized per channel over groups of 32 tokens, values per token over groups of 32
          channels, asymmetric (fp16 scale and zero point per group); windowed: the newest partial block
          stays in the cache's full-precision window, a full block is quantized at once (``encode``).
  alrkvd  adaptive low rank + low-bit residual, keys before RoPE (``rope_on_read``): per (layer, block) a
          fixed total rank budget is water-filled over the kv heads (keys and values) from each head's
          singular-value decay; the block's own basis (SVD) is stored 8-bit, latents at <= 8 bits, and the
          residual is rotated (fixed randomized Hadamard) and quantized at low bit width with per-group
          scales.  See docs/ALRKVD.md.

Options arrive as strings (``--kv-opt KEY=VALUE``) and are parsed with the defaults of each class.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import torch

from backend import trellis
# the codecs the kernels share (bit packing, Lloyd-Max levels, asymmetric quantization): kernels/codecs.py
from kernels.codecs import (GAUSS_SCALE_SEARCH, dequant_asym, gauss_codebook, kivi_dequantize, pack_bits, packed_len,
                            quant_asym, unpack_bits)

__all__ = [
    "KVFormat", "FP16Format", "Int8Format", "KIVIFormat", "ALRKVDFormat", "FORMATS", "make_format",
    "pack_bits", "unpack_bits", "packed_len", "gauss_codebook",
]


# ----------------------------------------------------------------------------------------------------
# option parsing
# ----------------------------------------------------------------------------------------------------

def _to_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {v!r}")


def _parse_options(name: str, spec: dict[str, tuple[Callable[[Any], Any], Any]], options: dict) -> dict:
    out = {k: d for k, (_, d) in spec.items()}
    for k, v in (options or {}).items():
        key = k.replace("-", "_")
        if key not in spec:
            raise ValueError(f"unknown option {k!r} for kv format {name!r} (known: {', '.join(sorted(spec))})")
        conv = spec[key][0]
        try:
            out[key] = conv(v) if v is not None else None
        except (TypeError, ValueError) as e:
            raise ValueError(f"bad value {v!r} for option {k!r} of kv format {name!r}: {e}") from None
    return out


# ----------------------------------------------------------------------------------------------------
# scalar quantizers
# ----------------------------------------------------------------------------------------------------

SCALE_SEARCH = {"gauss": GAUSS_SCALE_SEARCH, "trellis": (0.9, 1.0, 1.1)}


def quant_scaled(x: torch.Tensor, bits: int, codebook: str, scale_round: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 state_bits: int | None = None):
    """Symmetric quantization of groups (the last dim) on a unit-Gaussian codebook, one scale per group: the
    group RMS times the best of ``SCALE_SEARCH[codebook]`` (MSE-optimal per group). ``gauss``: each value
    on the Lloyd-Max levels; ``trellis``: the group's values coded together (`backend.trellis`, ``state_bits``
    its L, None: the default for ``bits``).
    ``scale_round`` maps a float scale to the value actually stored (default: fp16 rounding); the search runs on
    the rounded scales. Returns (codes int32, rounded scale float32 [..., 1])."""
    rnd = scale_round or (lambda t: t.to(torch.float16).float())
    rms = x.pow(2).mean(dim=-1, keepdim=True).sqrt().clamp_min(1e-8)
    scales = torch.stack([rnd(rms * f).clamp_min(1e-8) for f in SCALE_SEARCH[codebook]])   # [F, ..., 1]
    y = x / scales
    if codebook == "gauss":
        lv = gauss_codebook(bits).to(x.device)
        q = torch.bucketize(y.contiguous(), (lv[1:] + lv[:-1]) / 2).to(torch.int32)
    else:
        q = trellis.quantize(y.reshape(-1, y.shape[-1]), bits, state_bits).reshape(y.shape)
    err = (dequant_scaled(q, scales, bits, codebook, state_bits) - x).pow(2).sum(dim=-1, keepdim=True)
    best = err.argmin(0, keepdim=True)                   # the first of equal errors
    return q.gather(0, best.expand_as(q))[0], scales.gather(0, best)[0]


def dequant_scaled(q: torch.Tensor, scale: torch.Tensor, bits: int, codebook: str,
                   state_bits: int | None = None) -> torch.Tensor:
    unit = (gauss_codebook(bits).to(q.device)[q.long()] if codebook == "gauss"
            else trellis.dequantize(q, bits, state_bits))
    return unit * scale.float()


LOG_SCALE_STEPS = 16   # 8-bit log scales: scale = base * 2 ** (-code / 16), code in 0..255


def log_scale_base(max_scale: torch.Tensor) -> torch.Tensor:
    """fp16 base (rounded up) so that every scale <= max_scale has a code >= 0."""
    b = max_scale.clamp_min(1e-6).to(torch.float16)
    return torch.where(b.float() < max_scale, torch.nextafter(b, torch.full_like(b, 65504.0)), b)


def log_scale_round(s: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    code = log_scale_code(s, base)
    return base.float() * torch.exp2(-code.float() / LOG_SCALE_STEPS)


def log_scale_code(s: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    r = torch.log2(base.float() / s.clamp_min(1e-30))
    return torch.round(r * LOG_SCALE_STEPS).clamp_(0, 255).to(torch.uint8)


_ROT_CACHE: dict[tuple[int, int], torch.Tensor] = {}


def rotation_matrix(d: int, seed: int = 1234) -> torch.Tensor:
    """Fixed orthonormal rotation (float32 [d, d]): randomized Hadamard (random signs, seeded) when d is a
    power of two, else a seeded random orthogonal matrix.  A constant of the format: never stored per block."""
    key = (d, seed)
    if key not in _ROT_CACHE:
        g = torch.Generator().manual_seed(seed)
        if d & (d - 1) == 0:
            h = torch.ones(1, 1, dtype=torch.float64)
            while h.shape[0] < d:
                h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
            signs = torch.randint(0, 2, (d,), generator=g).double() * 2 - 1
            r = (signs[:, None] * h) / math.sqrt(d)
        else:
            a = torch.randn(d, d, generator=g, dtype=torch.float64)
            r, _ = torch.linalg.qr(a)
        _ROT_CACHE[key] = r.to(torch.float32)
    return _ROT_CACHE[key]


# ----------------------------------------------------------------------------------------------------
# formats
# ----------------------------------------------------------------------------------------------------

def orthonormalize(Y: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning those of Y [..., d, k] (float64): Cholesky QR, Y L^-T with L L^T = Y^T Y.
    Batched Cholesky and triangular solves are one call each on the GPU, where batched Householder QR loops
    over the matrices. A tiny diagonal shift keeps rank-deficient Y (e.g. an all-zero block) finite."""
    C = Y.transpose(-1, -2) @ Y
    shift = C.diagonal(dim1=-2, dim2=-1).sum(-1) * 1e-13 + 1e-300
    C = C + shift[..., None, None] * torch.eye(C.shape[-1], dtype=C.dtype, device=C.device)
    L = torch.linalg.cholesky_ex(C).L
    return torch.linalg.solve_triangular(L, Y.transpose(-1, -2), upper=False).transpose(-1, -2)


@functools.lru_cache(maxsize=None)
def _subspace_start(d: int, k: int, seed: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The fixed random start of subspace_eigh, made once per device (a host-to-device copy synchronises)."""
    return torch.randn(d, k, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(device)


def subspace_eigh(G: torch.Tensor, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k leading eigenpairs (ascending, like eigh) of symmetric PSD G [..., d, d] (float64): three steps
    of subspace iteration from a fixed random start, then a Rayleigh-Ritz step; Cholesky QR twice per
    step (the second pass restores orthonormality lost to the first one's conditioning). No host sync."""
    d = G.shape[-1]
    Q = _subspace_start(d, k, seed, G.dtype, G.device).expand(*G.shape[:-2], d, k)
    for _ in range(3):
        Q = orthonormalize(orthonormalize(G @ Q))
    w, V = torch.linalg.eigh(Q.transpose(-1, -2) @ G @ Q)
    return w, Q @ V


class KVFormat:
    """Base class.  Subclasses set ``name``, ``windowed``, ``rope_on_read``, ``default_block_size`` and
    ``OPTIONS`` ({name: (parser, default)}), allocate storage with ``self._alloc`` in ``_allocate``."""

    name = "base"
    windowed = False
    rope_on_read = False
    default_block_size = 16
    wants_saliency = False  # True: encode takes each token's saliency (the attention it received in the window)
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
        self.options = _parse_options(self.name, self.OPTIONS, options)
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

    def decode(self, layer: int, block_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Reconstruction of the listed blocks, in order: (k, v) each [n * block_size, H, D] in the model
        dtype (keys before RoPE when ``rope_on_read``)."""
        raise NotImplementedError

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


class FullFormat(KVFormat):
    """Uncompressed, in the model dtype: exact (the reference the tests compare against)."""

    name = "full"
    windowed = False
    default_block_size = 16

    def store_dtype(self) -> torch.dtype:
        return self.dtype

    def _allocate(self):
        shp = (self.block_size, self.num_kv_heads, self.head_dim)
        self._alloc("k_cache", shp, self.store_dtype())
        self._alloc("v_cache", shp, self.store_dtype())

    def write(self, layer, block_ids, offsets, k, v):
        b = self._ids(block_ids, self.device)
        o = self._ids(offsets, self.device)
        self.k_cache[layer, b, o] = k.to(self.k_cache.dtype)
        self.v_cache[layer, b, o] = v.to(self.v_cache.dtype)

    def decode(self, layer, block_ids):
        b = self._ids(block_ids, self.device)
        H, D = self.num_kv_heads, self.head_dim
        return (self.k_cache[layer, b].reshape(-1, H, D).to(self.dtype),
                self.v_cache[layer, b].reshape(-1, H, D).to(self.dtype))


class FP16Format(FullFormat):
    """16 bits per value, the serving baseline: the model dtype when it is 16-bit (bf16 on GPU),
    float16 when the model runs in float32 (CPU)."""

    name = "fp16"

    def store_dtype(self) -> torch.dtype:
        return self.dtype if self.dtype in (torch.float16, torch.bfloat16) else torch.float16


class Int8Format(KVFormat):
    """Symmetric int8 per (token, head), fp16 scale = absmax / 127.  Max abs error <= scale / 2."""

    name = "int8"
    windowed = False
    default_block_size = 16

    def _allocate(self):
        T, H, D = self.block_size, self.num_kv_heads, self.head_dim
        self._alloc("k_q", (T, H, D), torch.int8)
        self._alloc("v_q", (T, H, D), torch.int8)
        self._alloc("k_scale", (T, H), torch.float16)
        self._alloc("v_scale", (T, H), torch.float16)

    @staticmethod
    def _q(x):
        x = x.float()
        s = (x.abs().amax(-1) / 127.0).to(torch.float16)
        q = torch.round(x / s.float().clamp_min(1e-8)[..., None]).clamp_(-127, 127).to(torch.int8)
        return q, s

    def write(self, layer, block_ids, offsets, k, v):
        b = self._ids(block_ids, self.device)
        o = self._ids(offsets, self.device)
        kq, ks = self._q(k)
        vq, vs = self._q(v)
        self.k_q[layer, b, o] = kq
        self.k_scale[layer, b, o] = ks
        self.v_q[layer, b, o] = vq
        self.v_scale[layer, b, o] = vs

    def decode(self, layer, block_ids):
        b = self._ids(block_ids, self.device)
        H, D = self.num_kv_heads, self.head_dim
        k = self.k_q[layer, b].float() * self.k_scale[layer, b].float()[..., None]
        v = self.v_q[layer, b].float() * self.v_scale[layer, b].float()[..., None]
        return k.reshape(-1, H, D).to(self.dtype), v.reshape(-1, H, D).to(self.dtype)


class KIVIFormat(KVFormat):
    """KIVI (Liu et al. 2024): keys per channel over groups of ``group`` tokens, values per token over groups
    of ``group`` channels, asymmetric uniform ``bits``-bit codes with fp16 scale and zero point per group.
    The newest block_size (default 128 = KIVI's residual length) tokens stay in the cache's full-precision
    window.  Max abs error per element <= scale / 2 of its group."""

    name = "kivi"
    windowed = True
    default_block_size = 128
    OPTIONS = {"bits": (int, 2), "group": (int, 32)}

    def _validate(self):
        o = self.options
        if o["bits"] not in (1, 2, 3, 4, 5, 6, 7, 8):
            raise ValueError(f"kivi bits must be 1..8, got {o['bits']}")
        g = o["group"]
        if self.block_size % g or self.head_dim % g:
            raise ValueError(f"kivi group {g} must divide block_size {self.block_size} and head_dim {self.head_dim}")
        if self.block_size % 8 or self.head_dim % 8:
            raise ValueError("kivi needs block_size and head_dim multiples of 8 (bit packing)")

    def _allocate(self):
        T, H, D = self.block_size, self.num_kv_heads, self.head_dim
        b, g = self.options["bits"], self.options["group"]
        # keys: channel-major, codes packed along tokens (KIVI's per-channel layout)
        self._alloc("k_codes", (H, D, packed_len(T, b)), torch.uint8)
        self._alloc("k_scale", (H, D, T // g), torch.float16)
        self._alloc("k_zero", (H, D, T // g), torch.float16)
        # values: token-major, codes packed along channels
        self._alloc("v_codes", (T, H, packed_len(D, b)), torch.uint8)
        self._alloc("v_scale", (T, H, D // g), torch.float16)
        self._alloc("v_zero", (T, H, D // g), torch.float16)

    def encode(self, layer, block_id, k, v, start_pos=0):
        self.encode_blocks([(layer, block_id, start_pos, k, v)])

    def encode_blocks(self, blocks):
        """Every block in one quantization (a few tensor ops, not a few per block)."""
        layers, ids, _, k, v = zip(*blocks)
        at = (torch.tensor(layers, device=self.device), torch.tensor(ids, device=self.device))
        k, v = torch.stack(k).float(), torch.stack(v).float()                  # [n, T, H, D]
        n, T, H, D = k.shape
        b, g = self.options["bits"], self.options["group"]
        q, s, z = quant_asym(k.permute(0, 2, 3, 1).reshape(n, H, D, T // g, g), b, dim=-1)   # per channel
        self.k_codes[at] = pack_bits(q.reshape(n, H, D, T), b)
        self.k_scale[at], self.k_zero[at] = s[..., 0], z[..., 0]
        q, s, z = quant_asym(v.reshape(n, T, H, D // g, g), b, dim=-1)                     # per token
        self.v_codes[at] = pack_bits(q.reshape(n, T, H, D), b)
        self.v_scale[at], self.v_zero[at] = s[..., 0], z[..., 0]

    def decode(self, layer, block_ids):
        ids = self._ids(block_ids, self.device)
        k, v = self.dequantize(*(getattr(self, name)[layer, ids] for name in
                                 ("k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero")),
                               self.options["bits"], self.options["group"])
        return k.to(self.dtype), v.to(self.dtype)

    dequantize = staticmethod(kivi_dequantize)   # also the reference of the KIVI decode kernel


def _kivi(bits: int):
    class _K(KIVIFormat):
        name = f"kivi{bits}"
        OPTIONS = {"bits": (int, bits), "group": (int, 32)}
    _K.__name__ = f"KIVI{bits}Format"
    return _K


class ALRKVDFormat(KVFormat):
    """Adaptive low-rank + low-bit residual KV compression (ALR-KVD).

    Per (layer, block) and per stream s in (K head 0..H-1, V head 0..H-1), X_s [T, D] (keys before RoPE):
      1. SVD X_s = U S W^T (the block's own data).  The ranks r_s of all 2H streams share a fixed budget
         ``rank_budget`` (total rows per block, so the block has a fixed size): water-filling on the
         normalized energy S_i^2 / sum S^2 (keys weighted by ``key_weight``), each r_s within [rank_min, rank_max].
      2. Basis rows W_s[:, :r_s]^T stored int8 with one fp16 scale per row; latents L = X_s B^T (with the
         dequantized basis B) stored with ``latent_bits`` asymmetric codes, fp16 scale and zero per row.
      3. Residual E = X_s - L_hat B, rotated by a fixed randomized Hadamard matrix R (E R), quantized with
         ``k_bits`` / ``v_bits`` per element on the Gaussian Lloyd-Max levels (``codebook=gauss``), by a trellis
         code over the group (``codebook=trellis``, backend/trellis.py: the same bytes, 1.3 dB less error) or on
         uniform asymmetric levels (``codebook=uniform``), one fp16 scale (and zero for uniform) per ``group``
         consecutive channels of a token.  With ``v_low_tokens`` n > 0, in each block and kv head the n tokens
         that received the least attention while in the window (``saliency``, from the cache) keep
         ``v_low_bits``-bit value residuals: an unimportant token's value barely reaches the output.
    Decode: X_hat = L_hat B + E_hat R^T; the cache applies RoPE to keys after decode (``rope_on_read``).
    Blocks are segments: each block gets its own basis when it is encoded, and encoding a block never
    touches any other block (the refresh of the basis for the next segment is the next encode)."""

    name = "alrkvd"
    windowed = True
    rope_on_read = True
    default_block_size = 128
    OPTIONS = {
        "rank_budget": (int, None),      # total rank rows per (layer, block) over 2H streams; None -> see below
        "rank_per_head": (float, 4.0),   # default budget = round(rank_per_head * 2H)
        "rank_min": (int, 0),
        "rank_max": (int, None),         # None -> head_dim // 2
        "key_weight": (float, 4.0),      # energy weight of key streams vs value streams in water-filling
        "latent_bits": (int, 8),
        "basis_bits": (int, 8),
        "k_bits": (int, 2),
        "v_bits": (int, 2),
        "group": (int, 64),              # residual scale group (channels of one token)
        "codebook": (str, "gauss"),      # gauss | trellis | uniform
        "trellis_state_bits": (int, None),   # codebook=trellis: L of the k_bits/v_bits codes (None: 8 or 9; 12: less
                                             # error, 8x the work); v_low_bits codes keep the default
        "scale_bits": (int, 16),         # residual scales: 16 (fp16) or 8 (log2 steps of 1/16 under a per-block fp16 base)
        "rotate": (_to_bool, True),      # randomized Hadamard on the residual
        "seed": (int, 1234),
        "exact_tokens": (int, 0),        # per block, the tokens with the largest residual energy kept exactly (fp16)
        "key_frame": (str, "pre_rope"),  # keys compressed before RoPE (pre_rope), the residual after it (post_rope),
                                         # or basis, latents and residual all after it (rotated: no RoPE in a kernel)
        "basis_solver": (str, "eigh"),   # eigh: exact, on the CPU | subspace: top rank_max + 8 directions, on the data's device
        "v_low_tokens": (int, 0),        # per block and kv head: the least salient tokens get v_low_bits values
        "v_low_bits": (int, 2),
    }

    def _validate(self):
        o = self.options
        H, D, T = self.num_kv_heads, self.head_dim, self.block_size
        if o["rank_max"] is None:
            o["rank_max"] = D // 2
        if o["rank_budget"] is None:
            o["rank_budget"] = int(round(o["rank_per_head"] * 2 * H))
        if not 0 <= o["rank_min"] <= o["rank_max"] <= min(D, T):
            raise ValueError(f"need 0 <= rank_min <= rank_max <= min(head_dim, block_size), got {o['rank_min']}, {o['rank_max']}")
        if not 2 * H * o["rank_min"] <= o["rank_budget"] <= 2 * H * o["rank_max"]:
            raise ValueError(f"rank_budget {o['rank_budget']} outside [{2 * H * o['rank_min']}, {2 * H * o['rank_max']}]")
        for key in ("latent_bits", "basis_bits", "k_bits", "v_bits"):
            if not 1 <= o[key] <= 8:
                raise ValueError(f"{key} must be in 1..8")
        if o["codebook"] not in ("gauss", "trellis", "uniform"):
            raise ValueError("codebook must be gauss, trellis or uniform")
        if o["codebook"] == "gauss" and max(o["k_bits"], o["v_bits"]) > 6:
            raise ValueError("gauss codebook supports up to 6 bits")
        if o["codebook"] == "trellis":
            if max(o["k_bits"], o["v_bits"]) > max(trellis.DEFAULT_STATE_BITS) or o["group"] < 8:
                raise ValueError(f"trellis codebook supports up to {max(trellis.DEFAULT_STATE_BITS)} bits and groups of 8 or more")
            for bits in (o["k_bits"], o["v_bits"]):
                trellis.codebook(bits, o["trellis_state_bits"])          # raises if no table is shipped
        elif o["trellis_state_bits"] is not None:
            raise ValueError("trellis_state_bits applies to codebook=trellis only")
        if o["basis_solver"] not in ("eigh", "subspace"):
            raise ValueError("basis_solver must be eigh or subspace")
        if o["key_frame"] not in ("pre_rope", "post_rope", "rotated"):
            raise ValueError("key_frame must be pre_rope, post_rope or rotated")
        if o["scale_bits"] not in (8, 16) or (o["scale_bits"] == 8 and o["codebook"] == "uniform"):
            raise ValueError("scale_bits must be 16, or 8 with the gauss or trellis codebook")
        if o["v_low_tokens"] and not (0 < o["v_low_tokens"] < T and 1 <= o["v_low_bits"] < o["v_bits"]):
            raise ValueError("v_low_tokens must be in 1..block_size-1 and v_low_bits in 1..v_bits-1")
        if D % o["group"] or D % 8 or T % 8:
            raise ValueError("group must divide head_dim; head_dim and block_size must be multiples of 8")

    def _allocate(self):
        o = self.options
        T, H, D = self.block_size, self.num_kv_heads, self.head_dim
        R = o["rank_budget"]
        G = D // o["group"]
        self._alloc("ranks", (2 * H,), torch.int16)                       # K heads then V heads
        if R > 0:
            self._alloc("basis", (R, packed_len(D, o["basis_bits"]) if o["basis_bits"] < 8 else D),
                        torch.uint8 if o["basis_bits"] < 8 else torch.int8)
            self._alloc("basis_scale", (R,), torch.float16)
            # stream-major ([R, T] in memory): a stream's latents are rows of T contiguous bytes for the kernel
            self._alloc("latent", (T, packed_len(R, o["latent_bits"]) if R % 8 == 0 or o["latent_bits"] == 8
                                   else self._raise_r()), torch.uint8, order=(1, 0))
            self._alloc("latent_scale", (R,), torch.float16)
            self._alloc("latent_zero", (R,), torch.float16)
        uni = o["codebook"] == "uniform"
        head_major = (1, 2, 0)  # [T, H, G] scales stored as [H, G, T]: a head's tokens contiguous for the kernel
        n_low = o["v_low_tokens"]
        if n_low:   # per head: its salient tokens' codes in token order, then the rest's; which is which
            self._alloc("v_resid_low", (n_low, H, packed_len(D, o["v_low_bits"])), torch.uint8)
            self._alloc("v_low", (H, T // 8), torch.uint8)                 # bit t of head h: token t is low
        for kv, bits in (("k", o["k_bits"]), ("v", o["v_bits"])):
            # values' codes stored as [H, packed, T]: for the kernel a byte column's tokens are contiguous, as its
            # value dot (tokens along k) pairs them; keys' as [H, T, packed] (their dot pairs a token's columns, and
            # a head's tokens contiguous read 2-3% faster on the H200 than [T, H, packed]: BENCHMARKS.md section 2s)
            self._alloc(f"{kv}_resid", (T - (n_low if kv == "v" else 0), H, packed_len(D, bits)), torch.uint8,
                        order=head_major if kv == "v" else (1, 0, 2))
            if o["scale_bits"] == 8:
                self._alloc(f"{kv}_rscale", (T, H, G), torch.uint8, order=head_major)
                self._alloc(f"{kv}_rbase", (H,), torch.float16)
            else:
                self._alloc(f"{kv}_rscale", (T, H, G), torch.float16, order=head_major)
            if uni:
                self._alloc(f"{kv}_rzero", (T, H, G), torch.float16, order=head_major)
        if o["exact_tokens"]:
            n = o["exact_tokens"]
            self._alloc("exact_idx", (n,), torch.int16)
            self._alloc("exact_k", (n, H, D), torch.float16)
            self._alloc("exact_v", (n, H, D), torch.float16)
        self._rot = rotation_matrix(D, o["seed"]).to(self.device) if o["rotate"] else None
        self._rotary = None

    def set_rotary(self, rotary) -> None:
        """The model's RoPE tables (an object with ``cos``/``sin`` [max_len, D], HF half-split layout), needed
        by ``key_frame=post_rope`` and ``rotated``."""
        self._rotary = rotary

    def _rope(self, x: torch.Tensor, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """RoPE (or its inverse) of x [..., T, H, D] at positions [T] (float32)."""
        if self._rotary is None:
            raise ValueError(f"alrkvd key_frame={self.options['key_frame']} needs the model's RoPE tables: "
                             "call set_rotary(rotary)")
        cos = self._rotary.cos[positions].to(x.device, torch.float32)[:, None]     # [T, 1, D]
        sin = self._rotary.sin[positions].to(x.device, torch.float32)[:, None]
        half = x.shape[-1] // 2
        rot_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos - rot_half * sin if inverse else x * cos + rot_half * sin

    def _positions(self, start: int, n: int) -> torch.Tensor:
        return torch.arange(start, start + n, device=self.device)

    def _unrotated_keys(self, E: torch.Tensor, start_pos: int) -> torch.Tensor:
        """The key streams of E [n, T, 2H, D] (n consecutive blocks from ``start_pos``) taken back through RoPE."""
        n, T, H = E.shape[0], E.shape[1], self.num_kv_heads
        keys = E[:, :, :H].flatten(0, 1)
        return self._rope(keys, self._positions(start_pos, n * T), inverse=True).unflatten(0, (n, T))

    def _raise_r(self):
        raise ValueError("rank_budget must be a multiple of 8 when latent_bits < 8")

    LLOYD_MAX_DISTORTION = {1: 0.3634, 2: 0.1175, 3: 0.03454, 4: 0.009497, 5: 0.002499, 6: 0.0006642}

    @classmethod
    def relative_error_bound(cls, bits: int) -> float:
        """Stated bound on ||X_s - X_hat_s||_F / ||X_s||_F for one stream (head) of one block: the residual
        quantizer's relative error, 1.4 x sqrt(Lloyd-Max distortion of a unit Gaussian at ``bits``) (the
        rotation makes the residual near-Gaussian; the per-group scale search keeps it near the optimum;
        latent and basis quantization errors are absorbed by the residual, whose energy is at most the
        stream's).  Uniform codebooks and 7-8 bits use the same form with the uniform quantizer's error."""
        d = cls.LLOYD_MAX_DISTORTION.get(bits, 0.0006642 / 4 ** (bits - 6))
        return 1.4 * math.sqrt(d)

    # -- rank allocation ---------------------------------------------------------------------------------
    def allocate_ranks(self, svals: torch.Tensor, total: torch.Tensor | None = None) -> torch.Tensor:
        """Water-filling: svals [..., 2H, m] descending -> ranks [..., 2H] (long, on svals' device) summing to
        rank_budget, each in [rank_min, rank_max], maximizing the captured (weighted, normalized) energy.
        ``total`` [..., 2H]: each stream's whole energy (sum of all squared singular values) when svals holds
        only the leading ones. Leading dims are independent blocks."""
        o = self.options
        S2 = svals.float().pow(2)
        total = S2.sum(-1) if total is None else total.float()
        e = S2 / total[..., None].clamp_min(1e-20)
        H = self.num_kv_heads
        w = torch.ones(2 * H, device=e.device)   # made on the device: no host-to-device copy (a sync)
        w[:H] = o["key_weight"]
        e = e * w[..., None]
        lo, hi = o["rank_min"], min(o["rank_max"], svals.shape[-1])
        ranks = torch.full(e.shape[:-1], lo, dtype=torch.long, device=e.device)
        extra = o["rank_budget"] - 2 * H * lo
        if extra > 0:
            cand = e[..., lo:hi]                                      # [..., 2H, hi-lo]
            # strictly decreasing tie-break so that top-k picks prefixes of each stream
            cand = cand - torch.arange(hi - lo, device=e.device, dtype=e.dtype) * 1e-12
            top = torch.topk(cand.flatten(-2), extra).indices         # [..., extra]
            ranks.scatter_add_(-1, top // (hi - lo), torch.ones_like(top))
        return ranks

    def quantized_basis(self, svals: torch.Tensor, vh: torch.Tensor, total: torch.Tensor):
        """Blocks' bases from their `_svd` (svals [..., 2H, m], vh [..., 2H, m, D], total [..., 2H]): ranks
        [..., 2H] by water-filling, the leading rows of each stream [..., R, D] as symmetric ``basis_bits``
        codes (float) and their fp16 scales [..., R]. Leading dims are independent blocks (no host sync)."""
        ranks = self.allocate_ranks(svals, total)
        # budget row r belongs to the stream whose [start, end) holds it, as that stream's row r - start
        ends = ranks.cumsum(-1)
        r = torch.arange(self.options["rank_budget"], device=ranks.device).expand(*ranks.shape[:-1], -1).contiguous()
        owner = torch.searchsorted(ends, r, right=True)
        local = r - (ends - ranks).gather(-1, owner)
        index = (owner * vh.shape[-2] + local)[..., None].expand(*r.shape, vh.shape[-1])
        rows = vh.flatten(-3, -2).gather(-2, index)
        qmax = (1 << (self.options["basis_bits"] - 1)) - 1
        bscale = (rows.abs().amax(-1) / qmax).to(torch.float16)
        bq = torch.round(rows / bscale.float().clamp_min(1e-8)[..., None]).clamp_(-qmax, qmax)
        return ranks, bq, bscale

    # -- encode / decode ----------------------------------------------------------------------------------
    def _quant_resid(self, e: torch.Tensor, bits: int, low: bool = False):
        """e: [T, H, D] -> codes [T, H, D], stored scale [T, H, G] (fp16, or uint8 log codes), zero or None,
        base [H] (8-bit scales) or None. ``low``: the v_low_bits codes (a trellis of the default size)."""
        T, H, D = e.shape
        g = self.options["group"]
        x = e.reshape(T, H, D // g, g)
        codebook = self.options["codebook"]
        L = None if low else self.options["trellis_state_bits"]
        if codebook != "uniform":
            if self.options["scale_bits"] == 8:
                rms = x.pow(2).mean(-1, keepdim=True).sqrt()
                base = log_scale_base(rms.amax(dim=(0, 2, 3)) * 1.25)                  # [H] fp16
                bb = base.view(1, H, 1, 1)
                q, s = quant_scaled(x, bits, codebook, lambda t: log_scale_round(t, bb), L)
                return q.reshape(T, H, D), log_scale_code(s, bb)[..., 0], None, base
            q, s = quant_scaled(x, bits, codebook, state_bits=L)
            return q.reshape(T, H, D), s[..., 0].to(torch.float16), None, None
        q, s, z = quant_asym(x, bits, dim=-1)
        return q.reshape(T, H, D), s[..., 0], z[..., 0], None

    def _dequant_resid(self, q, s, z, bits, base=None, low=False):
        g = self.options["group"]
        shp = q.shape
        q = q.reshape(*shp[:-1], shp[-1] // g, g)
        if base is not None:                    # s: uint8 log codes [..., T, H, G], base [..., H]
            s = base.float()[..., None, :, None] * torch.exp2(-s.float() / LOG_SCALE_STEPS)
        if z is None:
            x = dequant_scaled(q, s[..., None], bits, self.options["codebook"],
                               None if low else self.options["trellis_state_bits"])
        else:
            x = dequant_asym(q, s[..., None], z[..., None])
        return x.reshape(shp)

    def _svd(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Leading singular values [N, m] (descending), the right singular vectors as rows [N, m, D] and each
        matrix's energy [N] (sum of all squared singular values) of X [N, T, D], from the D x D Gram matrix.
        ``basis_solver=eigh``: all m = D, float64 on the CPU. ``subspace``: m = min(rank_max + 8, D) by
        `subspace_eigh`, float64 on X's device (on the H200 2 ms for 512 matrices of 128 x 128 at 24
        directions, against 738 ms for the CPU eigh: benchmarks/bench_basis.py)."""
        G = (X.transpose(1, 2) @ X).double()
        exact = self.options["basis_solver"] == "eigh"
        if exact:
            w, U = torch.linalg.eigh(G.cpu())
            w, U = w.to(X.device), U.to(X.device)
        else:
            w, U = subspace_eigh(G, min(self.options["rank_max"] + 8, G.shape[-1]), self.options["seed"])
        w, U = w.flip(-1).clamp_min(0), U.flip(-1)
        S = w.sqrt().float()
        total = S.pow(2).sum(-1) if exact else G.diagonal(dim1=-2, dim2=-1).sum(-1).float()
        return S, U.transpose(1, 2).float(), total

    @property
    def wants_saliency(self) -> bool:
        return self.options["v_low_tokens"] > 0

    def encode(self, layer, block_id, k, v, start_pos: int | None = None, saliency: torch.Tensor | None = None):
        """Compress one full block: k [T, H, D] before RoPE, v [T, H, D].  ``start_pos`` (the position of
        the block's first token) is needed by ``key_frame=post_rope`` and ``rotated`` only; ``saliency`` [T, H] (the mean
        attention each token received from the queries that saw it) by ``v_low_tokens``."""
        o = self.options
        T, H, D = self.block_size, self.num_kv_heads, self.head_dim
        R = o["rank_budget"]
        post = o["key_frame"] == "post_rope"
        if o["key_frame"] != "pre_rope" and start_pos is None:
            raise ValueError(f"alrkvd key_frame={o['key_frame']}: encode needs start_pos (the block's first position)")
        keys = k.float()
        if o["key_frame"] == "rotated":   # the whole key in the frame of the rotated keys
            keys = self._rope(keys, self._positions(start_pos, T))
        X = torch.cat([keys, v.float()], dim=1).permute(1, 0, 2).contiguous()       # [2H, T, D]
        rec = torch.zeros_like(X)
        if R > 0:
            ranks, bq, bscale = self.quantized_basis(*self._svd(X))
            B = bq * bscale.float()[:, None]                                          # dequantized [R, D]
            owner = torch.repeat_interleave(torch.arange(2 * H, device=X.device), ranks)  # stream of each row
            lat = torch.einsum("rtd,rd->tr", X[owner], B)                             # [T, R]
            lq, ls, lz = quant_asym(lat, o["latent_bits"], dim=0)
            latd = dequant_asym(lq, ls, lz)                                           # [T, R]
            contrib = latd.t()[:, :, None] * B[:, None, :]                            # [R, T, D]
            rec.index_add_(0, owner, contrib)
            self.ranks[layer, block_id] = ranks.to(torch.int16)
            bb = o["basis_bits"]
            if bb == 8:
                self.basis[layer, block_id] = bq.to(torch.int8)
            else:
                self.basis[layer, block_id] = pack_bits((bq + (1 << (bb - 1))).to(torch.int32), bb)
            self.basis_scale[layer, block_id] = bscale
            self.latent[layer, block_id] = pack_bits(lq, o["latent_bits"])
            self.latent_scale[layer, block_id] = ls[0]
            self.latent_zero[layer, block_id] = lz[0]
        else:
            self.ranks[layer, block_id] = 0
        E = (X - rec).permute(1, 0, 2)                                                # [T, 2H, D]
        if o["exact_tokens"]:
            energy = E.pow(2).sum(dim=(1, 2))                                         # [T]
            idx = torch.topk(energy, o["exact_tokens"]).indices.sort().values
            self.exact_idx[layer, block_id] = idx.to(torch.int16)
            self.exact_k[layer, block_id] = k[idx].to(torch.float16)
            self.exact_v[layer, block_id] = v[idx].to(torch.float16)
        if post:    # key residual in the frame of the rotated keys: RoPE(k) - RoPE(L_hat B)
            E = torch.cat([self._rope(E[:, :H], self._positions(start_pos, T)), E[:, H:]], dim=1)
        if self._rot is not None:
            E = E @ self._rot
        for kv, sl, bits in (("k", slice(0, H), o["k_bits"]), ("v", slice(H, 2 * H), o["v_bits"])):
            q, s, z, base = self._quant_resid(E[:, sl], bits)
            if kv == "v" and o["v_low_tokens"]:
                q, s, z = self._split_low(layer, block_id, E[:, sl], q, s, z, saliency)
            getattr(self, f"{kv}_resid")[layer, block_id] = pack_bits(q, bits)
            getattr(self, f"{kv}_rscale")[layer, block_id] = s
            if z is not None:
                getattr(self, f"{kv}_rzero")[layer, block_id] = z
            if base is not None:
                getattr(self, f"{kv}_rbase")[layer, block_id] = base

    def compress_options(self):
        """The options the Triton compression kernel reads (kernels/alrkvd_compress.py); NotImplementedError for
        options it does not write."""
        from kernels.alrkvd_compress import CompressOptions, check_options
        o = self.options
        if o["latent_bits"] != 8 or o["basis_bits"] != 8 or o["rank_budget"] <= 0 or o.get("scale_bits", 16) != 16:
            raise NotImplementedError("the ALR-KVD compression kernel writes latent_bits=8, basis_bits=8, "
                                      "rank_budget>0, scale_bits=16")
        opts = CompressOptions(k_bits=o["k_bits"], v_bits=o["v_bits"], group=o["group"], codebook=o["codebook"],
                               rank_max=o["rank_max"], post_rope=o["key_frame"] == "post_rope")
        check_options(opts, self.head_dim)
        return opts

    def encode_with_kernel(self, layer, block_ids, k: torch.Tensor, v: torch.Tensor, start_pos=None) -> None:
        """What `encode` does per block, for full blocks `k, v [n, T, H, D]` (keys before RoPE) into `block_ids`,
        with the Triton compression kernel (kernels/alrkvd_compress.py; latent_bits = basis_bits = 8,
        rank_budget > 0): the basis here in PyTorch, then the kernel. `layer`: the layer of every block, or a
        list of each block's layer (one call for every layer of a decode step). `start_pos` [n]: each block's
        first position (key_frame=post_rope and rotated only)."""
        from kernels.alrkvd_compress import alrkvd_compress, device_indices
        opts = self.compress_options()
        o = self.options
        H, D, T = self.num_kv_heads, self.head_dim, self.block_size
        assert k.shape == v.shape and k.shape[1:] == (T, H, D) and k.stride() == v.stride() and k.stride(-1) == 1
        assert T & (T - 1) == 0 and D & (D - 1) == 0, "block_size and head_dim must be powers of two"
        n = len(block_ids)
        assert n == k.shape[0]
        if n == 0:
            return
        if o["key_frame"] != "pre_rope" and (start_pos is None or self._rotary is None):
            raise ValueError(f"alrkvd key_frame={o['key_frame']}: compress needs start_pos and fmt.set_rotary(rotary)")
        if o["key_frame"] == "rotated":  # the whole key after RoPE: rotate here once (fp32, as encode), then as pre_rope
            pos = (device_indices(start_pos, k.device)[:, None] + torch.arange(T, device=k.device)).flatten()
            k = self._rope(k.flatten(0, 1).float(), pos).unflatten(0, (n, T))
            v = v.float()
        layers = device_indices(layer if isinstance(layer, (list, tuple)) else [layer] * n, k.device)
        rows = layers * self.ranks.shape[1] + device_indices(block_ids, k.device)  # in the (layer, block)-flattened storage
        self._basis_rows(rows, k, v)
        post = opts.post_rope
        alrkvd_compress(opts, self.named_tensors(), rows, k, v,
                        start_pos=device_indices(start_pos, k.device) if post else None,
                        cos=self._rotary.cos if post else None, sin=self._rotary.sin if post else None, rot=self._rot)

    def _basis_rows(self, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Batched SVD, rank allocation and 8-bit basis of `encode` for blocks of any layers, written to
        ranks/basis/basis_scale at `rows` [n] of their (layer, block)-flattened views."""
        x = torch.cat([k.float(), v.float()], dim=2).permute(0, 2, 1, 3)  # [n, 2H, T, D]
        # the format's own decomposition (batched over blocks here) and basis, as encode uses them
        svals, vh, total = (t.unflatten(0, x.shape[:2]) for t in self._svd(x.flatten(0, 1)))
        ranks, bq, bscale = self.quantized_basis(svals, vh, total)
        self.ranks.flatten(0, 1)[rows] = ranks.to(torch.int16)
        self.basis.flatten(0, 1)[rows] = bq.to(torch.int8)
        self.basis_scale.flatten(0, 1)[rows] = bscale

    def _split_low(self, layer, block_id, e, q, s, z, saliency):
        """Values with ``v_low_tokens``: the least salient tokens of each head requantized at ``v_low_bits``
        (their codes stored, their scales and zeros merged into s, z); returns the salient tokens' codes."""
        if saliency is None:
            raise ValueError("alrkvd v_low_tokens: encode needs the tokens' saliency (the cache measures it)")
        T, n_low, bits = self.block_size, self.options["v_low_tokens"], self.options["v_low_bits"]
        low = torch.zeros(T, self.num_kv_heads, dtype=torch.bool, device=e.device)
        low.scatter_(0, saliency.to(e.device).argsort(0)[:n_low], True)
        ql, sl, zl, _ = self._quant_resid(e, bits, low=True)   # the same per-block scale base as the salient codes
        order = self._low_last(low)[..., None].expand_as(q)                            # [T, H, D]
        self.v_resid_low[layer, block_id] = pack_bits(ql.gather(0, order[T - n_low:]), bits)
        self.v_low[layer, block_id] = pack_bits(low.t().to(torch.int32), 1)
        m = low[..., None]
        return q.gather(0, order[:T - n_low]), torch.where(m, sl, s), None if z is None else torch.where(m, zl, z)

    @staticmethod
    def _low_last(low: torch.Tensor) -> torch.Tensor:
        """Token order along dim -2 of low [..., T, H]: each head's salient tokens, then its low ones."""
        return torch.argsort(low.to(torch.uint8), dim=-2, stable=True)

    def _decode_values(self, layer, ids):
        """Dequantized value residuals [n, T, H, D] (rotated frame) of blocks ``ids``."""
        o = self.options
        T, D = self.block_size, self.head_dim
        s = self.v_rscale[layer, ids]
        z = self.v_rzero[layer, ids] if o["codebook"] == "uniform" else None
        base = self.v_rbase[layer, ids] if o["scale_bits"] == 8 else None
        q = unpack_bits(self.v_resid[layer, ids], o["v_bits"], D)
        n_low = o["v_low_tokens"]
        if not n_low:
            return self._dequant_resid(q, s, z, o["v_bits"], base)
        low = unpack_bits(self.v_low[layer, ids], 1, T).transpose(-1, -2).bool()       # [n, T, H]
        order = self._low_last(low)
        s, z = (None if t is None else t.gather(1, order[..., None].expand_as(t)) for t in (s, z))
        parts = [self._dequant_resid(c, s[:, a:b], None if z is None else z[:, a:b], bits, base, low)
                 for c, a, b, bits, low in ((q, 0, T - n_low, o["v_bits"], False),
                                            (unpack_bits(self.v_resid_low[layer, ids], o["v_low_bits"], D), T - n_low,
                                             T, o["v_low_bits"], True))]
        x = torch.cat(parts, dim=1)
        return torch.empty_like(x).scatter_(1, order[..., None].expand_as(x), x)

    def decode(self, layer, block_ids, start_pos: int = 0):
        """Keys before RoPE and values of the listed blocks; with ``key_frame=post_rope`` or ``rotated`` the blocks
        are taken as consecutive from position ``start_pos`` (the cache decodes a sequence's table from its start)."""
        o = self.options
        ids = self._ids(block_ids, self.device)
        n = ids.numel()
        T, H, D = self.block_size, self.num_kv_heads, self.head_dim
        R = o["rank_budget"]
        uni = o["codebook"] == "uniform"
        q = unpack_bits(self.k_resid[layer, ids], o["k_bits"], D)                      # [n, T, H, D]
        z = self.k_rzero[layer, ids] if uni else None
        base = self.k_rbase[layer, ids] if o["scale_bits"] == 8 else None
        ek = self._dequant_resid(q, self.k_rscale[layer, ids], z, o["k_bits"], base)
        E = torch.cat([ek, self._decode_values(layer, ids)], dim=2)                    # [n, T, 2H, D]
        if self._rot is not None:
            E = E @ self._rot.t()
        if o["key_frame"] == "post_rope" and n:     # the key residual only
            E = torch.cat([self._unrotated_keys(E, start_pos), E[:, :, H:]], dim=2)
        if R > 0:
            bb = o["basis_bits"]
            if bb == 8:
                bq = self.basis[layer, ids].float()
            else:
                qmax = (1 << (bb - 1)) - 1
                bq = unpack_bits(self.basis[layer, ids], bb, D).float() - (qmax + 1)
            B = bq * self.basis_scale[layer, ids].float()[..., None]                 # [n, R, D]
            lq = unpack_bits(self.latent[layer, ids], o["latent_bits"], R)             # [n, T, R]
            lat = dequant_asym(lq, self.latent_scale[layer, ids][:, None], self.latent_zero[layer, ids][:, None])
            ranks = self.ranks[layer, ids].long()                                      # [n, 2H]
            # one-hot owner matrix per block: M[n, R, 2H]
            ends = ranks.cumsum(-1)
            starts = ends - ranks
            r = torch.arange(R, device=self.device)[None, :, None]
            M = ((r >= starts[:, None, :]) & (r < ends[:, None, :])).float()
            # rec[n, T, s, D] = sum_r lat[n,T,r] * M[n,r,s] * B[n,r,D]
            E = E + torch.einsum("ntr,nrs,nrd->ntsd", lat, M, B)
        if o["key_frame"] == "rotated" and n:       # the whole key
            E[:, :, :H] = self._unrotated_keys(E, start_pos)
        if o["exact_tokens"]:
            idx = self.exact_idx[layer, ids].long()                                    # [n, e]
            bidx = torch.arange(n, device=self.device)[:, None].expand_as(idx)
            E[bidx, idx, :H] = self.exact_k[layer, ids].float()
            E[bidx, idx, H:] = self.exact_v[layer, ids].float()
        k = E[:, :, :H].reshape(n * T, H, D)
        v = E[:, :, H:].reshape(n * T, H, D)
        return k.to(self.dtype), v.to(self.dtype)


def _alrkvd_key_scores(self, layer: int, block_id: int, q: torch.Tensor, start_pos: int | None = None) -> torch.Tensor:
    """Reference for fused kernels: q . k_hat for every token of one block, computed in the compressed
    domain, q [T, H, D] (one query per key token, in the pre-RoPE frame of that key, i.e. RoPE^-1(pos) q):
    (q B_s^T) . L_hat_s  +  (q' rot) . E_hat_rot  (exact tokens: q . k_exact), where q' = q for
    ``key_frame=pre_rope`` and q' = RoPE(pos) q, the query as it is, for ``post_rope`` (then ``start_pos``
    is the block's first position): with post_rope a kernel rotates the query by ``rot`` once and never
    touches the key residual again.  With ``rotated`` the low-rank part takes q' as well: (q' B_s^T) is one
    [R] vector per query and block, and no key is ever rotated.  Returns [T, H] float32."""
    o = self.options
    T, H, D = self.block_size, self.num_kv_heads, self.head_dim
    q = q.float()
    ids = torch.tensor([block_id], device=self.device)
    qq = unpack_bits(self.k_resid[layer, ids], o["k_bits"], D)[0]
    s_ = self.k_rscale[layer, ids][0]
    z = self.k_rzero[layer, ids][0] if o["codebook"] == "uniform" else None
    base = self.k_rbase[layer, ids][0] if o["scale_bits"] == 8 else None
    e_rot = self._dequant_resid(qq, s_, z, o["k_bits"], base)                       # [T, H, D] rotated frame
    q_res = q
    if o["key_frame"] != "pre_rope":
        q_res = self._rope(q, self._positions(start_pos, T))
    q_rot = q_res @ self._rot if self._rot is not None else q_res
    scores = (q_rot * e_rot).sum(-1)
    R = o["rank_budget"]
    if R > 0:
        bb = o["basis_bits"]
        if bb == 8:
            bq = self.basis[layer, block_id].float()
        else:
            bq = unpack_bits(self.basis[layer, block_id], bb, D).float() - (1 << (bb - 1))
        B = bq * self.basis_scale[layer, block_id].float()[:, None]                  # [R, D]
        lat = dequant_asym(unpack_bits(self.latent[layer, block_id], o["latent_bits"], R),
                           self.latent_scale[layer, block_id], self.latent_zero[layer, block_id])  # [T, R]
        ranks = self.ranks[layer, block_id].long().tolist()
        q_lr = q_res if o["key_frame"] == "rotated" else q
        start = 0
        for h in range(H):                                                           # key streams only
            r = ranks[h]
            if r:
                qb = q_lr[:, h] @ B[start:start + r].t()                             # [T, r] latent-space query
                scores[:, h] += (qb * lat[:, start:start + r]).sum(-1)
            start += r
    if o["exact_tokens"]:
        idx = self.exact_idx[layer, block_id].long()
        scores[idx] = (q[idx] * self.exact_k[layer, block_id].float()).sum(-1)
    return scores


ALRKVDFormat.key_scores = _alrkvd_key_scores


FORMATS: dict[str, type[KVFormat]] = {
    "full": FullFormat,
    "fp16": FP16Format,
    "int8": Int8Format,
    "kivi2": _kivi(2),
    "kivi3": _kivi(3),
    "kivi4": _kivi(4),
    "alrkvd": ALRKVDFormat,
}


def make_format(name: str, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                device, num_blocks: int, block_size: int | None = None, **options) -> KVFormat:
    if name not in FORMATS:
        raise ValueError(f"unknown kv format {name!r} (known: {', '.join(FORMATS)})")
    return FORMATS[name](num_layers, num_kv_heads, head_dim, dtype, device, num_blocks, block_size, **options)
