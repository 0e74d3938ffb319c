"""`int8`: symmetric int8 per (token, head) with an fp16 scale, written in place."""
from __future__ import annotations

import torch

from backend.kv_formats.base import KVFormat


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

    def decode(self, layer, block_ids, start_pos=0):
        b = self._ids(block_ids, self.device)
        H, D = self.num_kv_heads, self.head_dim
        k = self.k_q[layer, b].float() * self.k_scale[layer, b].float()[..., None]
        v = self.v_q[layer, b].float() * self.v_scale[layer, b].float()[..., None]
        return k.reshape(-1, H, D).to(self.dtype), v.reshape(-1, H, D).to(self.dtype)
