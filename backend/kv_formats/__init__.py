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

Files: base.py (KVFormat), full.py (full, fp16), int8.py, kivi.py, alrkvd.py, codecs.py (option parsing, ALR-KVD's
quantizers, rotation and eigensolvers; the codecs the kernels share are in kernels/codecs.py).
"""
from __future__ import annotations

import torch

from backend.kv_formats.alrkvd import ALRKVDFormat
from backend.kv_formats.base import KVFormat
from backend.kv_formats.codecs import (SCALE_SEARCH, dequant_scaled, orthonormalize, quant_scaled, rotation_matrix,
                                       subspace_eigh)
from backend.kv_formats.full import FP16Format, FullFormat
from backend.kv_formats.int8 import Int8Format
from backend.kv_formats.kivi import KIVIFormat, kivi_format
# the codecs the kernels share (bit packing, Lloyd-Max levels, asymmetric quantization): kernels/codecs.py
from kernels.codecs import dequant_asym, gauss_codebook, pack_bits, packed_len, quant_asym, unpack_bits

__all__ = [
    "KVFormat", "FullFormat", "FP16Format", "Int8Format", "KIVIFormat", "ALRKVDFormat", "FORMATS", "make_format",
    "pack_bits", "unpack_bits", "packed_len", "gauss_codebook", "quant_asym", "dequant_asym", "SCALE_SEARCH",
    "quant_scaled", "dequant_scaled", "rotation_matrix", "orthonormalize", "subspace_eigh",
]


FORMATS: dict[str, type[KVFormat]] = {
    "full": FullFormat,
    "fp16": FP16Format,
    "int8": Int8Format,
    "kivi2": kivi_format(2),
    "kivi3": kivi_format(3),
    "kivi4": kivi_format(4),
    "alrkvd": ALRKVDFormat,
}


def make_format(name: str, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                device, num_blocks: int, block_size: int | None = None, **options) -> KVFormat:
    if name not in FORMATS:
        raise ValueError(f"unknown kv format {name!r} (known: {', '.join(FORMATS)})")
    return FORMATS[name](num_layers, num_kv_heads, head_dim, dtype, device, num_blocks, block_size, **options)
