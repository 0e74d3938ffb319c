"""`kivi2`, `kivi3`, `kivi4`: KIVI (Liu et al. 2024), windowed; read on CUDA by kernels/kivi_attention.py."""
from __future__ import annotations

import torch

from backend.kv_formats.base import FormatKernels, KVFormat
from kernels.codecs import kivi_dequantize, pack_bits, packed_len, quant_asym


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

    def decode(self, layer, block_ids, start_pos=0):
        ids = self._ids(block_ids, self.device)
        k, v = self.dequantize(*(getattr(self, name)[layer, ids] for name in
                                 ("k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero")),
                               self.options["bits"], self.options["group"])
        return k.to(self.dtype), v.to(self.dtype)

    dequantize = staticmethod(kivi_dequantize)   # also the reference of the KIVI decode kernel

    def kernels(self, max_rows):
        from kernels.kivi_attention import KiviLayer, kivi_decode_attention
        try:
            layers = [KiviLayer.from_format(self, i) for i in range(self.num_layers)]
        except NotImplementedError as e:  # options the kernel does not read
            return self._no_kernels(str(e))
        return FormatKernels(kivi_decode_attention, layers)


def kivi_format(bits: int) -> type[KIVIFormat]:
    """KIVI at `bits` bits, as its own format (kivi2, kivi3, kivi4)."""
    class _K(KIVIFormat):
        name = f"kivi{bits}"
        OPTIONS = {"bits": (int, bits), "group": (int, 32)}
    _K.__name__ = f"KIVI{bits}Format"
    return _K
