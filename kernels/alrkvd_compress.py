"""One-pass ALR-KVD compression of full blocks (Triton): projection onto the block's basis, latent
quantization, residual (rotation, quantization) and packing, straight into the format's storage.

The basis comes first, written by the format in PyTorch on the device (`backend.kv_formats.ALRKVDFormat.
encode_with_kernel`): the batched SVD of all streams of all blocks, its rank water-filling and the 8-bit basis
quantization, exactly as its `encode` does them. The kernel then does the rest of `encode` for
one stream of one block per program (grid (n, 2H)), in chunks of 32 tokens (two passes: the latents'
range over the block first), never writing anything but the packed result:
    lat = X_s @ B_s^T                      latents [T, r_s], then asymmetric 8-bit per row over T
    E   = X_s - lat_hat @ B_s              residual; for keys with key_frame=post_rope, RoPE of the
                                           tokens' positions; then @ rot (if the format rotates)
(key_frame=rotated: the keys are rotated by RoPE in PyTorch first, then compressed as they are.)
    codes/scales per (token, group)        gauss: RMS x best of 5 factors on the Lloyd-Max levels;
                                           uniform: asymmetric; then bit-plane packing (pack_bits)
Same arithmetic as the PyTorch encode (fp32 IEEE dots, division and square root correctly rounded,
round half to even, fp16 rounding of scales): the results equal it up to float summation order,
which can move a value across a rounding boundary (tests: codes equal but for rare neighbours).

The kernel takes tensors and a `CompressOptions`, never the format object: the format passes its storage
tensors, the RoPE tables and the rotation. Public: `CompressOptions`, `check_options`,
`alrkvd_compress(opts, storage, rows, k, v, start_pos=None, cos=None, sin=None, rot=None)`, `device_indices`;
reference: the format's `encode`. Nothing runs at import.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.codecs import GAUSS_SCALE_SEARCH, gauss_codebook
from kernels.tuning import get_config

_DEFAULT = {"num_warps": 8, "num_stages": 1}
GAUSS_SEARCH = GAUSS_SCALE_SEARCH  # backend.kv_formats.SCALE_SEARCH["gauss"]


@triton.jit
def _round_half_even(x):
    f = tl.floor(x + 0.5)
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0
    return tl.where(((f - x) == 0.5) & odd, f - 1.0, f)


@triton.jit
def _quant_asym(x, QMAX: tl.constexpr, AXIS: tl.constexpr):
    """kernels.codecs.quant_asym over AXIS: (codes fp32, scale fp16, zero fp16) with scale and zero
    kept along AXIS (size 1)."""
    mn = tl.min(x, AXIS)
    mx = tl.max(x, AXIS)
    scale = ((mx - mn) / QMAX).to(tl.float16)
    zero = mn.to(tl.float16)
    s = tl.maximum(scale.to(tl.float32), 1e-8)
    q = _round_half_even(tl.div_rn(x - tl.expand_dims(zero.to(tl.float32), AXIS), tl.expand_dims(s, AXIS)))
    return tl.minimum(tl.maximum(q, 0.0), QMAX), scale, zero


@triton.jit
def _pack_plane_store(Row_ptrs, stride_byte, codes, BYTE0: tl.constexpr, W: tl.constexpr, SHIFT: tl.constexpr,
                      T: tl.constexpr, D: tl.constexpr):
    """Store bits SHIFT..SHIFT+W of codes [T, D] as one plane of pack_bits: value j in byte
    BYTE0 + j % (D // PER) at bit (j // (D // PER)) * W, PER = 8 // W."""
    PER: tl.constexpr = 8 // W
    plane = tl.reshape((codes >> SHIFT) & ((1 << W) - 1), [T, PER, D // PER])
    packed = tl.sum(plane << (tl.arange(0, PER) * W)[None, :, None], 1)
    tl.store(Row_ptrs[:, None] + (BYTE0 + tl.arange(0, D // PER)[None, :]) * stride_byte, packed.to(tl.uint8))


@triton.jit
def _pack_store(Row_ptrs, stride_byte, codes, BITS: tl.constexpr, T: tl.constexpr, D: tl.constexpr):
    if BITS == 8:
        _pack_plane_store(Row_ptrs, stride_byte, codes, 0, 8, 0, T, D)
    else:
        HAS4: tl.constexpr = (BITS >> 2) & 1
        HAS2: tl.constexpr = (BITS >> 1) & 1
        HAS1: tl.constexpr = BITS & 1
        if HAS4:
            _pack_plane_store(Row_ptrs, stride_byte, codes, 0, 4, 0, T, D)
        if HAS2:
            _pack_plane_store(Row_ptrs, stride_byte, codes, HAS4 * D // 2, 2, 4 * HAS4, T, D)
        if HAS1:
            _pack_plane_store(Row_ptrs, stride_byte, codes, HAS4 * D // 2 + HAS2 * D // 4, 1, 4 * HAS4 + 2 * HAS2,
                              T, D)


@triton.jit
def _quant_resid_store(e, Resid_rows, stride_byte, Scale_rows, Zero_rows, stride_cg, Levels, Edges, Search,
                       BITS: tl.constexpr, GROUP: tl.constexpr, UNIFORM: tl.constexpr,
                       NSEARCH: tl.constexpr, T: tl.constexpr, D: tl.constexpr):
    """Quantize the rotated residual e [T, D] per (token, group) and store codes, scales (, zeros)."""
    NG: tl.constexpr = D // GROUP
    x = tl.reshape(e, [T, NG, GROUP])
    offs_g = tl.arange(0, NG)
    if UNIFORM:
        q, scale, zero = _quant_asym(x, (1 << BITS) - 1, 2)
        tl.store(Zero_rows[:, None] + offs_g[None, :] * stride_cg, zero)
        codes = q.to(tl.int32)
    else:
        rms = tl.maximum(tl.sqrt_rn(tl.sum(x * x, 2) / GROUP), 1e-8)
        best_err = tl.full([T, NG], float("inf"), tl.float32)
        best_s = tl.zeros([T, NG], tl.float16)
        codes = tl.zeros([T, NG, GROUP], tl.int32)
        for i in tl.static_range(NSEARCH):
            s16 = (rms * tl.load(Search + i)).to(tl.float16)
            sf = tl.maximum(s16.to(tl.float32), 1e-8)
            v = tl.div_rn(x, sf[:, :, None])
            q = tl.zeros([T, NG, GROUP], tl.int32)
            for j in tl.static_range((1 << BITS) - 1):  # torch.bucketize: number of edges < v
                q += (tl.load(Edges + j) < v).to(tl.int32)
            diff = tl.load(Levels + q) * sf[:, :, None] - x
            err = tl.sum(diff * diff, 2)
            better = err < best_err
            best_err = tl.where(better, err, best_err)
            best_s = tl.where(better, s16, best_s)
            codes = tl.where(better[:, :, None], q, codes)
        scale = best_s
    tl.store(Scale_rows[:, None] + offs_g[None, :] * stride_cg, scale)
    _pack_store(Resid_rows, stride_byte, tl.reshape(codes, [T, D]), BITS, T, D)


@triton.jit
def _rotate_half(e, TC: tl.constexpr, D: tl.constexpr):
    """HF rotate_half of the rows of e [TC, D], cat(-e[:, D/2:], e[:, :D/2]), by moving data only (exact)."""
    halves = tl.permute(tl.reshape(e, [TC, 2, D // 2]), (0, 2, 1))  # [TC, D/2, 2]: (first, second) half
    first, second = tl.split(halves)
    return tl.reshape(tl.permute(tl.join(-second, first), (0, 2, 1)), [TC, D])


@triton.jit
def _alrkvd_compress_kernel(
    # Pointers: inputs
    K_src, V_src, Block_ids, Ranks, Basis, Basis_scale, Rot,
    Start_pos, Cos, Sin,  # key_frame=post_rope: first position of each block, RoPE tables
    K_levels, K_edges, V_levels, V_edges, Search,
    # Pointers: outputs
    Latent, Latent_scale, Latent_zero, K_resid, K_rscale, K_rzero, V_resid, V_rscale, V_rzero,
    # Strides
    stride_sn, stride_st, stride_sh,  # k and v sources [n, T, H, D]: block, token, head
    stride_rkn, stride_bn, stride_br, stride_bsn, stride_ln, stride_lt, stride_lr,  # latent: block, token, row
    stride_rn, stride_rt, stride_rh, stride_rb,  # k_resid: block, token, head, byte
    stride_vn, stride_vt, stride_vh, stride_vb,  # v_resid (its packed rows differ when v_bits != k_bits)
    stride_cn, stride_ct, stride_ch, stride_cg,  # k_rscale, v_rscale (and zeros): block, token, head, group
    stride_cs,  # Cos, Sin: position
    # Meta-parameters
    NUM_KV_HEADS: tl.constexpr, T: tl.constexpr, D: tl.constexpr, TC: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
    K_BITS: tl.constexpr, V_BITS: tl.constexpr, GROUP: tl.constexpr,
    UNIFORM: tl.constexpr, ROTATE: tl.constexpr, NSEARCH: tl.constexpr, POST_ROPE: tl.constexpr,
):
    """Grid (n, 2H): stream s (K heads, then V heads) of the i-th block to compress."""
    pid_i = tl.program_id(0)
    s = tl.program_id(1)
    h = s % NUM_KV_HEADS
    block = tl.load(Block_ids + pid_i).to(tl.int64)
    offs_c = tl.arange(0, TC)
    offs_d = tl.arange(0, D)
    offs_r = tl.arange(0, BLOCK_R)
    offs_s = tl.arange(0, BLOCK_S)

    # -- its basis rows (written by the PyTorch step), rows >= rank masked to 0
    rk = tl.load(Ranks + block * stride_rkn + offs_s, mask=offs_s < 2 * NUM_KV_HEADS, other=0).to(tl.int32)
    off = tl.sum(tl.where(offs_s < s, rk, 0), 0)
    rank = tl.sum(tl.where(offs_s == s, rk, 0), 0)
    mask_r = offs_r < rank
    bq = tl.load(Basis + block * stride_bn + (off + offs_r)[:, None] * stride_br + offs_d[None, :],
                 mask=mask_r[:, None], other=0).to(tl.float32)
    basis = bq * tl.load(Basis_scale + block * stride_bsn + off + offs_r, mask=mask_r, other=0.0).to(tl.float32)[:, None]

    # The block's T tokens go in chunks of TC (live tiles [TC, D], not [T, D]): a quarter of the spill
    # stack, i.e. of the local memory the driver reserves for every thread the device can hold.
    src = pid_i.to(tl.int64) * stride_sn + h * stride_sh + offs_d[None, :]
    if s < NUM_KV_HEADS:
        Src = K_src + src
    else:
        Src = V_src + src
    # -- pass 1: latents lat = X_s @ B_s^T, their min and max per row over the block's tokens
    mn = tl.full([BLOCK_R], float("inf"), tl.float32)
    mx = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for t0 in tl.static_range(0, T, TC):
        x = tl.load(Src + (t0 + offs_c)[:, None] * stride_st).to(tl.float32)
        lat = tl.dot(x, tl.trans(basis), input_precision="ieee")  # [TC, BLOCK_R]
        mn = tl.minimum(mn, tl.min(lat, 0))
        mx = tl.maximum(mx, tl.max(lat, 0))
    # kernels.codecs.quant_asym over the tokens: fp16 scale and zero (the minimum)
    lscale = ((mx - mn) / 255).to(tl.float16)
    lzero = mn.to(tl.float16)
    ls = tl.maximum(lscale.to(tl.float32), 1e-8)
    tl.store(Latent_scale + block * stride_bsn + off + offs_r, lscale, mask=mask_r)
    tl.store(Latent_zero + block * stride_bsn + off + offs_r, lzero, mask=mask_r)
    # -- pass 2, per chunk: latent codes; residual x - lat_hat @ B_s, rotated, quantized and packed
    for t0 in tl.static_range(0, T, TC):
        rows_t = t0 + offs_c
        x = tl.load(Src + rows_t[:, None] * stride_st).to(tl.float32)
        lat = tl.dot(x, tl.trans(basis), input_precision="ieee")
        lq = tl.minimum(tl.maximum(_round_half_even(tl.div_rn(lat - lzero.to(tl.float32)[None, :], ls[None, :])), 0.0), 255.0)
        tl.store(Latent + block * stride_ln + rows_t[:, None] * stride_lt + (off + offs_r)[None, :] * stride_lr,
                 lq.to(tl.uint8), mask=mask_r[None, :])
        lat_hat = lq * lscale.to(tl.float32)[None, :] + lzero.to(tl.float32)[None, :]
        e = x - tl.dot(lat_hat, basis, input_precision="ieee")
        if POST_ROPE:
            if s < NUM_KV_HEADS:  # the key residual in the frame of the rotated keys
                cs = (tl.load(Start_pos + pid_i) + rows_t)[:, None] * stride_cs + offs_d[None, :]
                e = e * tl.load(Cos + cs) + _rotate_half(e, TC, D) * tl.load(Sin + cs)
        if ROTATE:
            rot = tl.load(Rot + offs_d[:, None] * D + offs_d[None, :])
            e = tl.dot(e, rot, input_precision="ieee")
        rows_c = block * stride_cn + h * stride_ch + rows_t * stride_ct
        if s < NUM_KV_HEADS:
            rows_r = block * stride_rn + h * stride_rh + rows_t * stride_rt
            _quant_resid_store(e, K_resid + rows_r, stride_rb, K_rscale + rows_c, K_rzero + rows_c, stride_cg,
                               K_levels, K_edges, Search, K_BITS, GROUP, UNIFORM, NSEARCH, TC, D)
        else:
            rows_r = block * stride_vn + h * stride_vh + rows_t * stride_vt
            _quant_resid_store(e, V_resid + rows_r, stride_vb, V_rscale + rows_c, V_rzero + rows_c, stride_cg,
                               V_levels, V_edges, Search, V_BITS, GROUP, UNIFORM, NSEARCH, TC, D)


@dataclass(frozen=True)
class CompressOptions:
    """What the kernel writes: the format's options it reads (ALRKVDFormat.compress_options())."""
    k_bits: int
    v_bits: int
    group: int           # residual scale group (channels of one token)
    codebook: str        # "gauss" (Lloyd-Max levels, scale search) or "uniform" (asymmetric)
    rank_max: int        # most basis rows of one stream
    post_rope: bool = False  # key_frame=post_rope: the key residual rotated by RoPE (cos, sin) before quantization


def check_options(opts: CompressOptions, head_dim: int) -> None:
    """NotImplementedError for options the kernel does not write."""
    if opts.codebook not in ("gauss", "uniform"):
        raise NotImplementedError("the ALR-KVD compression kernel writes gauss or uniform codes")
    if opts.codebook == "gauss" and opts.group < head_dim and max(opts.k_bits, opts.v_bits) > 2:
        # compiled for the H200 (triton 3.6) this case wrote wrong codes for half the bytes (interpreted it is
        # right); refused until found. kernels/README.md, "Known problems".
        raise NotImplementedError("the ALR-KVD compression kernel does not write gauss codes of more than 2 bits "
                                  "with group < head_dim")


@functools.lru_cache(maxsize=None)
def _device_constants(bits: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lloyd-Max levels of `bits`, the edges between them and the scale search factors, on `device` once
    (a host-to-device copy from pageable memory synchronises, which would stall a side-stream compression)."""
    lv = gauss_codebook(bits).to(device)
    return lv, ((lv[1:] + lv[:-1]) / 2).contiguous(), torch.tensor(GAUSS_SEARCH, dtype=torch.float32, device=device)


def device_indices(values, device) -> torch.Tensor:
    """int64 [n] on `device` from a Python list, through pinned memory on CUDA: no synchronisation."""
    t = torch.as_tensor(values, dtype=torch.int64).reshape(-1)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def alrkvd_compress(opts: CompressOptions, storage: Mapping[str, torch.Tensor], rows: torch.Tensor,
                    k: torch.Tensor, v: torch.Tensor, start_pos: torch.Tensor | None = None,
                    cos: torch.Tensor | None = None, sin: torch.Tensor | None = None,
                    rot: torch.Tensor | None = None) -> None:
    """Latents and residual codes of full blocks `k, v [n, T, H, D]` (keys in the frame the format compresses
    them in) into ALR-KVD storage whose basis of these blocks is already written.

    storage: the format's tensors by name (`ALRKVDFormat.named_tensors()`, layouts in docs/ALRKVD.md), each
    `[num_layers, num_blocks, ...]`; read: ranks, basis, basis_scale; written: latent, latent_scale, latent_zero,
    k_resid, k_rscale, v_resid, v_rscale (and k_rzero, v_rzero for the uniform codebook). rows [n] int64 on
    k's device: each block's row in the (layer, block)-flattened storage (layer * num_blocks + block).
    start_pos [n] int64 (each block's first position) and cos, sin [max_len, D] fp32 (RoPE tables, HF layout):
    with `opts.post_rope` only. rot [D, D] fp32: the residual's rotation, None: none."""
    H, D, T = k.shape[2], k.shape[3], k.shape[1]
    check_options(opts, D)
    assert k.shape == v.shape and k.stride() == v.stride() and k.stride(-1) == 1
    assert T & (T - 1) == 0 and D & (D - 1) == 0, "block_size and head_dim must be powers of two"
    n = k.shape[0]
    assert rows.shape == (n,)
    if n == 0:
        return
    uniform = opts.codebook == "uniform"
    dev = k.device
    post = opts.post_rope
    if post:
        assert start_pos is not None and cos is not None and sin is not None
        start = start_pos
    else:
        start = cos = sin = rows  # never read

    k_lv, k_edges, search = _device_constants(opts.k_bits, dev)  # read with the gauss codebook only
    v_lv, v_edges, _ = _device_constants(opts.v_bits, dev)
    # every storage tensor as [num_layers * num_blocks, ...] (views: layers and blocks are the outer dims),
    # row = layer * NB + block
    ranks, basis, basis_scale, lat, lat_scale, lat_zero, kres, ksc, vres, vsc = (
        storage[name].flatten(0, 1) for name in ("ranks", "basis", "basis_scale", "latent", "latent_scale",
                                                 "latent_zero", "k_resid", "k_rscale", "v_resid", "v_rscale"))
    kz, vz = (storage["k_rzero"].flatten(0, 1), storage["v_rzero"].flatten(0, 1)) if uniform else (ksc, ksc)
    assert vsc.stride() == ksc.stride() and kz.stride() == ksc.stride() and vz.stride() == ksc.stride()
    cfg = get_config("alrkvd_compress", f"head_dim={D},block_size={T}", dev, _DEFAULT)
    _alrkvd_compress_kernel[(n, 2 * H)](
        k, v, rows, ranks, basis, basis_scale, rot if rot is not None else search,
        start, cos, sin,
        k_lv, k_edges, v_lv, v_edges, search,
        lat, lat_scale, lat_zero,
        kres, ksc, kz,
        vres, vsc, vz,
        k.stride(0), k.stride(1), k.stride(2),
        ranks.stride(0), basis.stride(0), basis.stride(1),
        basis_scale.stride(0), lat.stride(0), lat.stride(1), lat.stride(2),
        kres.stride(0), kres.stride(1), kres.stride(2), kres.stride(3),
        vres.stride(0), vres.stride(1), vres.stride(2), vres.stride(3),
        ksc.stride(0), ksc.stride(1), ksc.stride(2), ksc.stride(3),
        cos.stride(0) if post else 0,
        NUM_KV_HEADS=H, T=T, D=D, TC=min(32, T),
        BLOCK_R=max(16, triton.next_power_of_2(opts.rank_max)), BLOCK_S=triton.next_power_of_2(2 * H),
        K_BITS=opts.k_bits, V_BITS=opts.v_bits, GROUP=opts.group, UNIFORM=uniform, ROTATE=rot is not None,
        NSEARCH=len(GAUSS_SEARCH), POST_ROPE=post, **cfg,
    )
