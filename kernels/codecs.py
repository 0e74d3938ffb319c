"""Codecs shared by the KV formats (backend/kv_formats/) and the kernels that read or write their storage:
bit packing, the Gaussian Lloyd-Max levels, asymmetric uniform quantization, KIVI's dequantization.

PyTorch only (no Triton): the formats' PyTorch encode and decode run them, and the kernels' references and
host-side constants (e.g. the levels the ALR-KVD compression kernel reads) take them from here, so the
kernels never import the engine. Nothing runs at import.
"""
from __future__ import annotations

import torch

__all__ = [
    "pack_bits", "unpack_bits", "packed_len", "byte_table", "unpack_levels", "gauss_codebook",
    "GAUSS_SCALE_SEARCH", "quant_asym", "dequant_asym", "kivi_dequantize",
]


# ----------------------------------------------------------------------------------------------------
# bit packing: b bits = sum of power-of-two planes (4, 2, 1 bits; 8 is a plain byte), highest plane first.
# Plane with w bits holds 8/w values per byte in n/(8/w) bytes; value j of the plane sits in byte j % (n/(8/w))
# at bit (j // (n/(8/w))) * w: the bits at one position of every byte are a contiguous run of values, so a
# kernel unpacks a run with one mask per byte and needs no interleave.  Plane order in the packed last dim: the
# plane of the highest power first, each plane holding the corresponding bits of the code (e.g. 3 bits: plane
# 2-bit = code & 3, then plane 1-bit = code >> 2).
# ----------------------------------------------------------------------------------------------------

def _planes(bits: int) -> list[int]:
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in 1..8, got {bits}")
    if bits == 8:
        return [8]
    return [w for w in (4, 2, 1) if bits & w]


def packed_len(n: int, bits: int) -> int:
    if (n * 1) % 8 and bits != 8:
        raise ValueError(f"packed dimension {n} must be a multiple of 8")
    return sum(n * w // 8 for w in _planes(bits))


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes: integer tensor with values in [0, 2**bits) -> uint8 tensor, last dim packed_len(n, bits)."""
    c = codes.to(torch.int32)
    n = c.shape[-1]
    parts = []
    shift = 0
    for w in _planes(bits):
        plane = (c >> shift) & ((1 << w) - 1)
        shift += w
        per = 8 // w
        p = plane.reshape(*c.shape[:-1], per, n // per)
        sh = torch.arange(per, device=c.device, dtype=torch.int32)[:, None] * w
        parts.append((p << sh).sum(-2).to(torch.uint8))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def unpack_bits(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of pack_bits: uint8 [..., packed_len(n, bits)] -> int32 codes [..., n]."""
    p = packed.to(torch.int32)
    out = torch.zeros(*p.shape[:-1], n, dtype=torch.int32, device=p.device)
    pos = 0
    shift = 0
    for w in _planes(bits):
        per = 8 // w
        nb = n // per
        chunk = p[..., pos:pos + nb]
        pos += nb
        sh = torch.arange(per, device=p.device, dtype=torch.int32)[:, None] * w
        vals = (chunk.unsqueeze(-2) >> sh) & ((1 << w) - 1)                   # [..., per, nb]
        out |= vals.reshape(*p.shape[:-1], n) << shift
        shift += w
    return out



# A byte of a one-plane code (1, 2, 4 or 8 bits) holds 8 / bits codes: looking each byte up in a table of their levels
# rebuilds them in one gather, where unpack_bits takes shifts, masks and a gather per code (the CPU decode path).

def byte_table(levels: torch.Tensor, bits: int) -> torch.Tensor:
    """[256, 8 // bits] float32: for each byte value, the levels of the one-plane codes it packs."""
    assert _planes(bits) == [bits], "one-plane codes only: 1, 2, 4 or 8 bits"
    per = 8 // bits
    codes = (torch.arange(256)[:, None] >> (torch.arange(per) * bits)) & ((1 << bits) - 1)
    return levels.float()[codes.to(levels.device)]


def unpack_levels(packed: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """levels[unpack_bits(packed)] for one-plane codes, float32 [..., n]; `table` from `byte_table`."""
    x = torch.nn.functional.embedding(packed.int(), table)          # [..., nb, per]: byte b's codes side by side
    return x.transpose(-1, -2).flatten(-2)                             # a plane's runs: code p * nb + b at p, b


# ----------------------------------------------------------------------------------------------------
# scalar quantizers
# ----------------------------------------------------------------------------------------------------

_GAUSS_CACHE: dict[int, torch.Tensor] = {}


def gauss_codebook(bits: int) -> torch.Tensor:
    """Lloyd-Max levels for a unit Gaussian (float32, ascending, 2**bits levels), computed once."""
    if bits not in _GAUSS_CACHE:
        n = 1 << bits
        x = torch.linspace(-6, 6, 24001, dtype=torch.float64)
        pdf = torch.exp(-0.5 * x * x)
        lv = torch.linspace(-2.0, 2.0, n, dtype=torch.float64) if n > 1 else torch.zeros(1, dtype=torch.float64)
        for _ in range(300):
            edges = (lv[1:] + lv[:-1]) / 2
            idx = torch.bucketize(x, edges)
            num = torch.zeros(n, dtype=torch.float64).index_add_(0, idx, pdf * x)
            den = torch.zeros(n, dtype=torch.float64).index_add_(0, idx, pdf)
            lv = num / den
        _GAUSS_CACHE[bits] = lv.to(torch.float32)
    return _GAUSS_CACHE[bits]


# scale factors of a gauss-coded group: its RMS times the best of these (backend.kv_formats.SCALE_SEARCH["gauss"])
GAUSS_SCALE_SEARCH = (0.8, 0.9, 1.0, 1.12, 1.25)


def quant_asym(x: torch.Tensor, bits: int, dim: int):
    """Asymmetric uniform quantization with min and scale over ``dim`` (kept), both rounded to fp16 first.
    Returns (codes int32, scale fp16, zero fp16 (the minimum))."""
    qmax = (1 << bits) - 1
    mn = x.amin(dim=dim, keepdim=True)
    mx = x.amax(dim=dim, keepdim=True)
    scale = ((mx - mn) / qmax).to(torch.float16)
    zero = mn.to(torch.float16)
    s = scale.float().clamp_min(1e-8)
    q = torch.round((x - zero.float()) / s).clamp_(0, qmax).to(torch.int32)
    return q, scale, zero


def dequant_asym(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float() + zero.float()


# ----------------------------------------------------------------------------------------------------
# KIVI storage
# ----------------------------------------------------------------------------------------------------

def kivi_dequantize(k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, bits: int, group: int):
    """KIVI's dequantization: keys and values [n * T, H, D] of n blocks' storage (each tensor [n, ...] as
    `backend.kv_formats.KIVIFormat` allocates it). The format's decode and the reference of the KIVI decode
    kernel (kernels/kivi_attention.py)."""
    n, H, D = k_codes.shape[:3]
    T = v_codes.shape[1]
    q = unpack_bits(k_codes, bits, T).reshape(n, H, D, T // group, group)
    k = dequant_asym(q, k_scale[..., None], k_zero[..., None])
    k = k.reshape(n, H, D, T).permute(0, 3, 1, 2).reshape(n * T, H, D)
    q = unpack_bits(v_codes, bits, D).reshape(n, T, H, D // group, group)
    v = dequant_asym(q, v_scale[..., None], v_zero[..., None])
    return k, v.reshape(n * T, H, D)
