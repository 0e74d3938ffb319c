"""Uncompressed formats: `full` (the model dtype) and `fp16` (16 bits per value, the serving baseline)."""
from __future__ import annotations

import functools

import torch

from backend.kv_formats.base import FormatKernels, KVFormat


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
        from kernels.paged_attention import store_kv_ref
        store_kv_ref(k, v, self.k_cache[layer], self.v_cache[layer], self._ids(block_ids, self.device),
                     self._ids(offsets, self.device))

    def decode(self, layer, block_ids, start_pos=0):
        b = self._ids(block_ids, self.device)
        H, D = self.num_kv_heads, self.head_dim
        return (self.k_cache[layer, b].reshape(-1, H, D).to(self.dtype),
                self.v_cache[layer, b].reshape(-1, H, D).to(self.dtype))

    def kernels(self, max_rows):
        from kernels.paged_attention import paged_decode_attention, paged_tiles_attention
        layers = [(self.k_cache[i], self.v_cache[i]) for i in range(self.num_layers)]
        # the decode kernel's merge tickets, zeros between calls: held here so a CUDA graph holds no memset
        tickets = torch.zeros(max_rows * self.num_kv_heads, dtype=torch.int32, device=self.device)
        return FormatKernels(functools.partial(paged_decode_attention, tickets=tickets), layers,
                             tiles=paged_tiles_attention, stores_as_is=True)


class FP16Format(FullFormat):
    """16 bits per value, the serving baseline: the model dtype when it is 16-bit (bf16 on GPU),
    float16 when the model runs in float32 (CPU)."""

    name = "fp16"

    def store_dtype(self) -> torch.dtype:
        return self.dtype if self.dtype in (torch.float16, torch.bfloat16) else torch.float16
