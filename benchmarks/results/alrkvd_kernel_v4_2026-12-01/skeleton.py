"""Prototype: residual-only 2-bit decode attention (codes + per-token scale/zero for K and V), in two
orientations, to see what Triton makes of each. Not the product."""
import torch, triton, triton.language as tl
from kernels.paged_attention import fp16_code, LOG2E


@triton.jit
def _runs(b):
    x = b.to(tl.int16)
    return fp16_code(x & 3), fp16_code(x & 12), fp16_code(x & 48), fp16_code(x & 192)


@triton.jit
def skel_qk(Q, KC, KS, KZ, VC, VS, VZ, Mid_o, Mid_lse, qk_scale, N, num_splits,
            H: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """orientation A: s = q @ codes^T, out += p @ vcodes (what the kernels do today)."""
    NB: tl.constexpr = D // 4
    b = tl.program_id(0).to(tl.int64); h = tl.program_id(1); sp = tl.program_id(2)
    offs_g = tl.arange(0, BLOCK_G); offs_c = tl.arange(0, NB); offs_n = tl.arange(0, BLOCK_N)
    mg = offs_g < G
    qrow = Q + (b * H * G + h * G + offs_g)[:, None] * D
    q0 = tl.load(qrow + offs_c[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    q1 = tl.load(qrow + NB + offs_c[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    q2 = tl.load(qrow + 2 * NB + offs_c[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    q3 = tl.load(qrow + 3 * NB + offs_c[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    qsum = tl.sum(q0.to(tl.float32) + q1.to(tl.float32) + q2.to(tl.float32) + q3.to(tl.float32), 1)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32); l_i = tl.zeros([BLOCK_G], tl.float32)
    a0 = tl.zeros([BLOCK_G, NB], tl.float32); a1 = tl.zeros([BLOCK_G, NB], tl.float32)
    a2 = tl.zeros([BLOCK_G, NB], tl.float32); a3 = tl.zeros([BLOCK_G, NB], tl.float32)
    per = N // num_splits
    base = (b * H + h) * N
    for start in range(sp * per, sp * per + per, BLOCK_N):
        tok = base + start + offs_n
        k0, k1, k2, k3 = _runs(tl.load(KC + tok[:, None] * NB + offs_c[None, :]))
        s = tl.dot(q0, tl.trans(k0)) + tl.dot(q1, tl.trans(k1)) * 0.25 + tl.dot(q2, tl.trans(k2)) * 0.0625 \
            + tl.dot(q3, tl.trans(k3)) * 0.015625
        s = s * tl.load(KS + tok).to(tl.float32)[None, :] + qsum[:, None] * tl.load(KZ + tok).to(tl.float32)[None, :]
        s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1); m_i = m_new
        ps = (p * tl.load(VS + tok).to(tl.float32)[None, :]).to(tl.float16)
        pz = tl.sum(p * tl.load(VZ + tok).to(tl.float32)[None, :], 1)[:, None]
        v0, v1, v2, v3 = _runs(tl.load(VC + tok[:, None] * NB + offs_c[None, :]))
        a0 = a0 * alpha[:, None] + tl.dot(ps, v0) + pz
        a1 = a1 * alpha[:, None] + tl.dot(ps, v1) * 0.25 + pz
        a2 = a2 * alpha[:, None] + tl.dot(ps, v2) * 0.0625 + pz
        a3 = a3 * alpha[:, None] + tl.dot(ps, v3) * 0.015625 + pz
    orow = Mid_o + ((b * H * G + h * G + offs_g) * num_splits + sp)[:, None] * D
    tl.store(orow + offs_c[None, :], a0 / l_i[:, None], mask=mg[:, None])
    tl.store(orow + NB + offs_c[None, :], a1 / l_i[:, None], mask=mg[:, None])
    tl.store(orow + 2 * NB + offs_c[None, :], a2 / l_i[:, None], mask=mg[:, None])
    tl.store(orow + 3 * NB + offs_c[None, :], a3 / l_i[:, None], mask=mg[:, None])
    tl.store(Mid_lse + (b * H * G + h * G + offs_g) * num_splits + sp, m_i + tl.log2(l_i), mask=mg)


@triton.jit
def skel_swap(Q, KC, KS, KZ, VC, VS, VZ, Mid_o, Mid_lse, qk_scale, N, num_splits,
              H: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """orientation B (swap AB): s^T = codes @ q^T (codes the A operand, in registers), out^T += vcodes^T @ p^T."""
    NB: tl.constexpr = D // 4
    b = tl.program_id(0).to(tl.int64); h = tl.program_id(1); sp = tl.program_id(2)
    offs_g = tl.arange(0, BLOCK_G); offs_c = tl.arange(0, NB); offs_n = tl.arange(0, BLOCK_N)
    mg = offs_g < G
    qcol = Q + (b * H * G + h * G + offs_g)[None, :] * D  # q^T [NB, BLOCK_G] per run
    q0 = tl.load(qcol + offs_c[:, None], mask=mg[None, :], other=0.).to(tl.float16)
    q1 = tl.load(qcol + NB + offs_c[:, None], mask=mg[None, :], other=0.).to(tl.float16)
    q2 = tl.load(qcol + 2 * NB + offs_c[:, None], mask=mg[None, :], other=0.).to(tl.float16)
    q3 = tl.load(qcol + 3 * NB + offs_c[:, None], mask=mg[None, :], other=0.).to(tl.float16)
    qsum = tl.sum(q0.to(tl.float32) + q1.to(tl.float32) + q2.to(tl.float32) + q3.to(tl.float32), 0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32); l_i = tl.zeros([BLOCK_G], tl.float32)
    a0 = tl.zeros([NB, BLOCK_G], tl.float32); a1 = tl.zeros([NB, BLOCK_G], tl.float32)
    a2 = tl.zeros([NB, BLOCK_G], tl.float32); a3 = tl.zeros([NB, BLOCK_G], tl.float32)
    per = N // num_splits
    base = (b * H + h) * N
    for start in range(sp * per, sp * per + per, BLOCK_N):
        tok = base + start + offs_n
        k0, k1, k2, k3 = _runs(tl.load(KC + tok[:, None] * NB + offs_c[None, :]))
        s = tl.dot(k0, q0) + tl.dot(k1, q1) * 0.25 + tl.dot(k2, q2) * 0.0625 + tl.dot(k3, q3) * 0.015625
        s = s * tl.load(KS + tok).to(tl.float32)[:, None] + tl.load(KZ + tok).to(tl.float32)[:, None] * qsum[None, :]
        s = s * qk_scale  # [BLOCK_N, BLOCK_G]
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, 0); m_i = m_new
        ps = (p * tl.load(VS + tok).to(tl.float32)[:, None]).to(tl.float16)  # [BLOCK_N, BLOCK_G]
        pz = tl.sum(p * tl.load(VZ + tok).to(tl.float32)[:, None], 0)[None, :]
        v0, v1, v2, v3 = _runs(tl.load(VC + tok[None, :] * NB + offs_c[:, None]))  # codes^T [NB, BLOCK_N]
        a0 = a0 * alpha[None, :] + tl.dot(v0, ps) + pz
        a1 = a1 * alpha[None, :] + tl.dot(v1, ps) * 0.25 + pz
        a2 = a2 * alpha[None, :] + tl.dot(v2, ps) * 0.0625 + pz
        a3 = a3 * alpha[None, :] + tl.dot(v3, ps) * 0.015625 + pz
    ocol = Mid_o + ((b * H * G + h * G + offs_g) * num_splits + sp)[None, :] * D
    tl.store(ocol + offs_c[:, None], a0 / l_i[None, :], mask=mg[None, :])
    tl.store(ocol + NB + offs_c[:, None], a1 / l_i[None, :], mask=mg[None, :])
    tl.store(ocol + 2 * NB + offs_c[:, None], a2 / l_i[None, :], mask=mg[None, :])
    tl.store(ocol + 3 * NB + offs_c[:, None], a3 / l_i[None, :], mask=mg[None, :])
    tl.store(Mid_lse + (b * H * G + h * G + offs_g) * num_splits + sp, m_i + tl.log2(l_i), mask=mg)


@triton.jit
def _pair(a, b, NB: tl.constexpr, BLOCK_N: tl.constexpr):
    """[NB, BLOCK_N] x2 -> [2 NB, BLOCK_N]: rows 0..NB-1 from a, NB.. from b."""
    return tl.reshape(tl.permute(tl.join(a, b), (2, 0, 1)), (2 * NB, BLOCK_N))


@triton.jit
def skel_swap2(Q, KC, KS, KZ, VC, VS, VZ, Mid_o, Mid_lse, qk_scale, N, num_splits,
               H: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """swap AB, with the value runs paired to M = 64 (wgmma for the values too)."""
    NB: tl.constexpr = D // 4
    b = tl.program_id(0).to(tl.int64); h = tl.program_id(1); sp = tl.program_id(2)
    offs_g = tl.arange(0, BLOCK_G); offs_c = tl.arange(0, NB); offs_n = tl.arange(0, BLOCK_N)
    offs_c2 = tl.arange(0, 2 * NB)
    mg = offs_g < G
    qcol = Q + (b * H * G + h * G + offs_g)[None, :] * D
    q0 = tl.load(qcol + offs_c[:, None], mask=mg[None, :], other=0.).to(tl.float16)
    q1 = tl.load(qcol + NB + offs_c[:, None], mask=mg[None, :], other=0.).to(tl.float16)
    q2 = tl.load(qcol + 2 * NB + offs_c[:, None], mask=mg[None, :], other=0.).to(tl.float16)
    q3 = tl.load(qcol + 3 * NB + offs_c[:, None], mask=mg[None, :], other=0.).to(tl.float16)
    qsum = tl.sum(q0.to(tl.float32) + q1.to(tl.float32) + q2.to(tl.float32) + q3.to(tl.float32), 0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32); l_i = tl.zeros([BLOCK_G], tl.float32)
    a01 = tl.zeros([2 * NB, BLOCK_G], tl.float32); a23 = tl.zeros([2 * NB, BLOCK_G], tl.float32)
    # run r of a pair is scaled by 4^-r: the pair's rows carry 1 and 1/4 (then 1/16 for the second pair)
    half = tl.where(offs_c2 < NB, 1.0, 0.25)[:, None]
    per = N // num_splits
    base = (b * H + h) * N
    for start in range(sp * per, sp * per + per, BLOCK_N):
        tok = base + start + offs_n
        k0, k1, k2, k3 = _runs(tl.load(KC + tok[:, None] * NB + offs_c[None, :]))
        s = tl.dot(k0, q0) + tl.dot(k1, q1) * 0.25 + tl.dot(k2, q2) * 0.0625 + tl.dot(k3, q3) * 0.015625
        s = s * tl.load(KS + tok).to(tl.float32)[:, None] + tl.load(KZ + tok).to(tl.float32)[:, None] * qsum[None, :]
        s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, 0); m_i = m_new
        ps = (p * tl.load(VS + tok).to(tl.float32)[:, None]).to(tl.float16)
        pz = tl.sum(p * tl.load(VZ + tok).to(tl.float32)[:, None], 0)[None, :]
        v0, v1, v2, v3 = _runs(tl.load(VC + tok[None, :] * NB + offs_c[:, None]))
        a01 = a01 * alpha[None, :] + tl.dot(_pair(v0, v1, NB, BLOCK_N), ps) * half + pz
        a23 = a23 * alpha[None, :] + tl.dot(_pair(v2, v3, NB, BLOCK_N), ps) * (half * 0.0625) + pz
    ocol = Mid_o + ((b * H * G + h * G + offs_g) * num_splits + sp)[None, :] * D
    tl.store(ocol + offs_c2[:, None], a01 / l_i[None, :], mask=mg[None, :])
    tl.store(ocol + 2 * NB + offs_c2[:, None], a23 / l_i[None, :], mask=mg[None, :])
    tl.store(Mid_lse + (b * H * G + h * G + offs_g) * num_splits + sp, m_i + tl.log2(l_i), mask=mg)


@triton.jit
def skel_alr(Q, KC, KS, KZ, VC, VS, VZ, Mid_o, Mid_lse, qk_scale, N, num_splits,
             KB, KBS, KL, KLS, KLZ, VB, VBS, VL, VLS, VLZ, Cos, Sin,
             H: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
             R: tl.constexpr, T: tl.constexpr, ROPE_REGS: tl.constexpr, LR_KEYS: tl.constexpr, F16: tl.constexpr = False, SWAPK: tl.constexpr = False,
             S_lr=None, LR_BUF: tl.constexpr = False):
    """skel_qk + the low-rank parts of ALR-KVD (rank R per stream, blocks of T tokens, basis rotated to the
    tile start, RoPE_j per token, values in latent space). Contiguous per (b, h); no paging."""
    NB: tl.constexpr = D // 4
    HALF: tl.constexpr = D // 2
    b = tl.program_id(0).to(tl.int64); h = tl.program_id(1); sp = tl.program_id(2)
    offs_g = tl.arange(0, BLOCK_G); offs_c = tl.arange(0, NB); offs_n = tl.arange(0, BLOCK_N)
    offs_h = tl.arange(0, HALF); offs_r = tl.arange(0, R)
    mg = offs_g < G
    qrow = Q + (b * H * G + h * G + offs_g)[:, None] * D
    q0 = tl.load(qrow + offs_c[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    q1 = tl.load(qrow + NB + offs_c[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    q2 = tl.load(qrow + 2 * NB + offs_c[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    q3 = tl.load(qrow + 3 * NB + offs_c[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    qh1 = tl.load(qrow + offs_h[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    qh2 = tl.load(qrow + HALF + offs_h[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    qsum = tl.sum(q0.to(tl.float32) + q1.to(tl.float32) + q2.to(tl.float32) + q3.to(tl.float32), 1)
    if SWAPK:
        qcol = Q + (b * H * G + h * G + offs_g)[None, :] * D
        qt1 = tl.load(qcol + offs_h[:, None], mask=mg[None, :], other=0.).to(tl.float16)
        qt2 = tl.load(qcol + HALF + offs_h[:, None], mask=mg[None, :], other=0.).to(tl.float16)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32); l_i = tl.zeros([BLOCK_G], tl.float32)
    a0 = tl.zeros([BLOCK_G, NB], tl.float32); a1 = tl.zeros([BLOCK_G, NB], tl.float32)
    a2 = tl.zeros([BLOCK_G, NB], tl.float32); a3 = tl.zeros([BLOCK_G, NB], tl.float32)
    j_off = offs_n[:, None] * HALF + offs_h[None, :]
    if ROPE_REGS:
        cos_j = tl.load(Cos + j_off); sin_j = tl.load(Sin + j_off)
        if F16:
            cos_j = cos_j.to(tl.float16); sin_j = sin_j.to(tl.float16)
    per = N // num_splits
    bh = b * H + h
    base = bh * N
    for start in range(sp * per, sp * per + per, BLOCK_N):
        tok = base + start + offs_n
        blk = bh * (N // T) + start // T
        rows = start % T + offs_n
        if LR_KEYS:
            # low-rank keys: basis rotated to the tile start, latents @ basis', RoPE_j
            bks = tl.load(KBS + blk * R + offs_r).to(tl.float32)[:, None]
            bk1 = tl.load(KB + (blk * R + offs_r)[:, None] * D + offs_h[None, :]).to(tl.float32) * bks
            bk2 = tl.load(KB + (blk * R + offs_r)[:, None] * D + HALF + offs_h[None, :]).to(tl.float32) * bks
            c0 = tl.load(Cos + start * HALF + offs_h)[None, :]; s0 = tl.load(Sin + start * HALF + offs_h)[None, :]
            b1 = bk1 * c0 - bk2 * s0; b2 = bk2 * c0 + bk1 * s0
            lk = tl.load(KL + (blk * R + offs_r)[None, :] * T + rows[:, None]).to(tl.float32) \
                * tl.load(KLS + blk * R + offs_r).to(tl.float32)[None, :] + tl.load(KLZ + blk * R + offs_r).to(tl.float32)[None, :]
            lk = lk.to(tl.float16)
            if F16:
                k1 = tl.dot(lk, b1.to(tl.float16), out_dtype=tl.float16); k2 = tl.dot(lk, b2.to(tl.float16), out_dtype=tl.float16)
            else:
                k1 = tl.dot(lk, b1.to(tl.float16)); k2 = tl.dot(lk, b2.to(tl.float16))
            if not ROPE_REGS:
                cos_j = tl.load(Cos + j_off); sin_j = tl.load(Sin + j_off)
                if F16:
                    cos_j = cos_j.to(tl.float16); sin_j = sin_j.to(tl.float16)
            r1 = k1 * cos_j - k2 * sin_j; r2 = k2 * cos_j + k1 * sin_j
        k0c, k1c, k2c, k3c = _runs(tl.load(KC + tok[:, None] * NB + offs_c[None, :]))
        s = tl.dot(q0, tl.trans(k0c)) + tl.dot(q1, tl.trans(k1c)) * 0.25 + tl.dot(q2, tl.trans(k2c)) * 0.0625 \
            + tl.dot(q3, tl.trans(k3c)) * 0.015625
        s = s * tl.load(KS + tok).to(tl.float32)[None, :] + qsum[:, None] * tl.load(KZ + tok).to(tl.float32)[None, :]
        if LR_BUF:
            s += tl.load(S_lr + (b * H * G + h * G + offs_g)[:, None] * N + (start + offs_n)[None, :], mask=mg[:, None], other=0.0)
        if LR_KEYS:
            if SWAPK:
                s += tl.trans(tl.dot(r1.to(tl.float16), qt1) + tl.dot(r2.to(tl.float16), qt2))
            else:
                s += tl.dot(qh1, tl.trans(r1.to(tl.float16))) + tl.dot(qh2, tl.trans(r2.to(tl.float16)))
        s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1); m_i = m_new
        p16 = p.to(tl.float16)
        # low-rank values: p @ latents, up-projected by the block's basis run by run
        lv = tl.load(VL + (blk * R + offs_r)[None, :] * T + rows[:, None]).to(tl.float32) \
            * tl.load(VLS + blk * R + offs_r).to(tl.float32)[None, :] + tl.load(VLZ + blk * R + offs_r).to(tl.float32)[None, :]
        p_lat = tl.dot(p16, lv.to(tl.float16)).to(tl.float16)
        bvs = tl.load(VBS + blk * R + offs_r).to(tl.float32)[:, None]
        bvp = VB + (blk * R + offs_r)[:, None] * D + offs_c[None, :]
        ps = (p * tl.load(VS + tok).to(tl.float32)[None, :]).to(tl.float16)
        pz = tl.sum(p * tl.load(VZ + tok).to(tl.float32)[None, :], 1)[:, None]
        v0, v1, v2, v3 = _runs(tl.load(VC + tok[:, None] * NB + offs_c[None, :]))
        a0 = a0 * alpha[:, None] + tl.dot(ps, v0) + pz + tl.dot(p_lat, (tl.load(bvp) * bvs).to(tl.float16))
        a1 = a1 * alpha[:, None] + tl.dot(ps, v1) * 0.25 + pz + tl.dot(p_lat, (tl.load(bvp + NB) * bvs).to(tl.float16))
        a2 = a2 * alpha[:, None] + tl.dot(ps, v2) * 0.0625 + pz + tl.dot(p_lat, (tl.load(bvp + 2 * NB) * bvs).to(tl.float16))
        a3 = a3 * alpha[:, None] + tl.dot(ps, v3) * 0.015625 + pz + tl.dot(p_lat, (tl.load(bvp + 3 * NB) * bvs).to(tl.float16))
    orow = Mid_o + ((b * H * G + h * G + offs_g) * num_splits + sp)[:, None] * D
    tl.store(orow + offs_c[None, :], a0 / l_i[:, None], mask=mg[:, None])
    tl.store(orow + NB + offs_c[None, :], a1 / l_i[:, None], mask=mg[:, None])
    tl.store(orow + 2 * NB + offs_c[None, :], a2 / l_i[:, None], mask=mg[:, None])
    tl.store(orow + 3 * NB + offs_c[None, :], a3 / l_i[:, None], mask=mg[:, None])
    tl.store(Mid_lse + (b * H * G + h * G + offs_g) * num_splits + sp, m_i + tl.log2(l_i), mask=mg)


@triton.jit
def _row(x, offs_g, g: tl.constexpr):
    return tl.sum(tl.where(offs_g[:, None] == g, x, 0.0), 0)


@triton.jit
def _qrot(q1, q2, offs_g, g: tl.constexpr, cos_j, sin_j):
    """RoPE_{-j}(q_g) for the tile offsets j: halves [BLOCK_N, HALF] fp16."""
    a = _row(q1, offs_g, g)[None, :]
    b = _row(q2, offs_g, g)[None, :]
    return (a * cos_j + b * sin_j).to(tl.float16), (b * cos_j - a * sin_j).to(tl.float16)


@triton.jit
def _lr_score(s, qa, qb, b1t, b2t, u, offs_g, g: tl.constexpr):
    """s + the low-rank key scores of head g in row g: sum_r u[j, r] (RoPE_{-j}(q_g) . b'_r)."""
    w = tl.dot(qa, b1t) + tl.dot(qb, b2t)  # [BLOCK_N, R]
    sg = tl.sum(w * u, 1)
    return s + tl.where(offs_g[:, None] == g, sg[None, :], 0.0)


@triton.jit
def skel_alrq(Q, KC, KS, KZ, VC, VS, VZ, Mid_o, Mid_lse, qk_scale, N, num_splits,
              KB, KBS, KL, KLS, KLZ, VB, VBS, VL, VLS, VLZ, Cos, Sin,
              H: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
              R: tl.constexpr, T: tl.constexpr):
    """skel_alr with the low-rank key scores from queries rotated per tile offset (held for the loop) against the
    basis rotated to the tile start: no RoPE on rebuilt keys, no rebuilt keys at all. G must be 4."""
    NB: tl.constexpr = D // 4
    HALF: tl.constexpr = D // 2
    b = tl.program_id(0).to(tl.int64); h = tl.program_id(1); sp = tl.program_id(2)
    offs_g = tl.arange(0, BLOCK_G); offs_c = tl.arange(0, NB); offs_n = tl.arange(0, BLOCK_N)
    offs_h = tl.arange(0, HALF); offs_r = tl.arange(0, R)
    mg = offs_g < G
    qrow = Q + (b * H * G + h * G + offs_g)[:, None] * D
    q0 = tl.load(qrow + offs_c[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    q1 = tl.load(qrow + NB + offs_c[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    q2 = tl.load(qrow + 2 * NB + offs_c[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    q3 = tl.load(qrow + 3 * NB + offs_c[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    qh1 = tl.load(qrow + offs_h[None, :], mask=mg[:, None], other=0.)
    qh2 = tl.load(qrow + HALF + offs_h[None, :], mask=mg[:, None], other=0.)
    qsum = tl.sum(q0.to(tl.float32) + q1.to(tl.float32) + q2.to(tl.float32) + q3.to(tl.float32), 1)
    j_off = offs_n[:, None] * HALF + offs_h[None, :]
    cos_j = tl.load(Cos + j_off); sin_j = tl.load(Sin + j_off)
    qa0, qb0 = _qrot(qh1, qh2, offs_g, 0, cos_j, sin_j)
    qa1, qb1 = _qrot(qh1, qh2, offs_g, 1, cos_j, sin_j)
    qa2, qb2 = _qrot(qh1, qh2, offs_g, 2, cos_j, sin_j)
    qa3, qb3 = _qrot(qh1, qh2, offs_g, 3, cos_j, sin_j)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32); l_i = tl.zeros([BLOCK_G], tl.float32)
    a0 = tl.zeros([BLOCK_G, NB], tl.float32); a1 = tl.zeros([BLOCK_G, NB], tl.float32)
    a2 = tl.zeros([BLOCK_G, NB], tl.float32); a3 = tl.zeros([BLOCK_G, NB], tl.float32)
    per = N // num_splits
    bh = b * H + h
    base = bh * N
    for start in range(sp * per, sp * per + per, BLOCK_N):
        tok = base + start + offs_n
        blk = bh * (N // T) + start // T
        rows = start % T + offs_n
        # the basis rotated to the tile start, transposed [HALF, R] halves
        bks = tl.load(KBS + blk * R + offs_r).to(tl.float32)[None, :]
        bk1 = tl.load(KB + (blk * R + offs_r)[None, :] * D + offs_h[:, None]).to(tl.float32) * bks
        bk2 = tl.load(KB + (blk * R + offs_r)[None, :] * D + HALF + offs_h[:, None]).to(tl.float32) * bks
        c0 = tl.load(Cos + start * HALF + offs_h)[:, None]; s0 = tl.load(Sin + start * HALF + offs_h)[:, None]
        b1t = (bk1 * c0 - bk2 * s0).to(tl.float16); b2t = (bk2 * c0 + bk1 * s0).to(tl.float16)
        u = tl.load(KL + (blk * R + offs_r)[None, :] * T + rows[:, None]).to(tl.float32) \
            * tl.load(KLS + blk * R + offs_r).to(tl.float32)[None, :] + tl.load(KLZ + blk * R + offs_r).to(tl.float32)[None, :]
        k0c, k1c, k2c, k3c = _runs(tl.load(KC + tok[:, None] * NB + offs_c[None, :]))
        s = tl.dot(q0, tl.trans(k0c)) + tl.dot(q1, tl.trans(k1c)) * 0.25 + tl.dot(q2, tl.trans(k2c)) * 0.0625 \
            + tl.dot(q3, tl.trans(k3c)) * 0.015625
        s = s * tl.load(KS + tok).to(tl.float32)[None, :] + qsum[:, None] * tl.load(KZ + tok).to(tl.float32)[None, :]
        s = _lr_score(s, qa0, qb0, b1t, b2t, u, offs_g, 0)
        s = _lr_score(s, qa1, qb1, b1t, b2t, u, offs_g, 1)
        s = _lr_score(s, qa2, qb2, b1t, b2t, u, offs_g, 2)
        s = _lr_score(s, qa3, qb3, b1t, b2t, u, offs_g, 3)
        s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1); m_i = m_new
        p16 = p.to(tl.float16)
        lv = tl.load(VL + (blk * R + offs_r)[None, :] * T + rows[:, None]).to(tl.float32) \
            * tl.load(VLS + blk * R + offs_r).to(tl.float32)[None, :] + tl.load(VLZ + blk * R + offs_r).to(tl.float32)[None, :]
        p_lat = tl.dot(p16, lv.to(tl.float16)).to(tl.float16)
        bvs = tl.load(VBS + blk * R + offs_r).to(tl.float32)[:, None]
        bvp = VB + (blk * R + offs_r)[:, None] * D + offs_c[None, :]
        ps = (p * tl.load(VS + tok).to(tl.float32)[None, :]).to(tl.float16)
        pz = tl.sum(p * tl.load(VZ + tok).to(tl.float32)[None, :], 1)[:, None]
        v0, v1, v2, v3 = _runs(tl.load(VC + tok[:, None] * NB + offs_c[None, :]))
        a0 = a0 * alpha[:, None] + tl.dot(ps, v0) + pz + tl.dot(p_lat, (tl.load(bvp) * bvs).to(tl.float16))
        a1 = a1 * alpha[:, None] + tl.dot(ps, v1) * 0.25 + pz + tl.dot(p_lat, (tl.load(bvp + NB) * bvs).to(tl.float16))
        a2 = a2 * alpha[:, None] + tl.dot(ps, v2) * 0.0625 + pz + tl.dot(p_lat, (tl.load(bvp + 2 * NB) * bvs).to(tl.float16))
        a3 = a3 * alpha[:, None] + tl.dot(ps, v3) * 0.015625 + pz + tl.dot(p_lat, (tl.load(bvp + 3 * NB) * bvs).to(tl.float16))
    orow = Mid_o + ((b * H * G + h * G + offs_g) * num_splits + sp)[:, None] * D
    tl.store(orow + offs_c[None, :], a0 / l_i[:, None], mask=mg[:, None])
    tl.store(orow + NB + offs_c[None, :], a1 / l_i[:, None], mask=mg[:, None])
    tl.store(orow + 2 * NB + offs_c[None, :], a2 / l_i[:, None], mask=mg[:, None])
    tl.store(orow + 3 * NB + offs_c[None, :], a3 / l_i[:, None], mask=mg[:, None])
    tl.store(Mid_lse + (b * H * G + h * G + offs_g) * num_splits + sp, m_i + tl.log2(l_i), mask=mg)


@triton.jit
def lr_scores(Q, S_lr, N, KB, KBS, KL, KLS, KLZ, Cos, Sin,
              H: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
              R: tl.constexpr, T: tl.constexpr, F16: tl.constexpr):
    """The low-rank key scores q . RoPE_t(latents_t @ basis) of one tile of BLOCK_N tokens, all heads of the group,
    written to S_lr [B, Hq, N] fp32: no loop, no softmax state."""
    HALF: tl.constexpr = D // 2
    b = tl.program_id(0).to(tl.int64); h = tl.program_id(1); t = tl.program_id(2)
    offs_g = tl.arange(0, BLOCK_G); offs_n = tl.arange(0, BLOCK_N); offs_h = tl.arange(0, HALF); offs_r = tl.arange(0, R)
    mg = offs_g < G
    qrow = Q + (b * H * G + h * G + offs_g)[:, None] * D
    qh1 = tl.load(qrow + offs_h[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    qh2 = tl.load(qrow + HALF + offs_h[None, :], mask=mg[:, None], other=0.).to(tl.float16)
    start = t * BLOCK_N
    bh = b * H + h
    blk = bh * (N // T) + start // T
    rows = start % T + offs_n
    bks = tl.load(KBS + blk * R + offs_r).to(tl.float32)[:, None]
    bk1 = tl.load(KB + (blk * R + offs_r)[:, None] * D + offs_h[None, :]).to(tl.float32) * bks
    bk2 = tl.load(KB + (blk * R + offs_r)[:, None] * D + HALF + offs_h[None, :]).to(tl.float32) * bks
    c0 = tl.load(Cos + start * HALF + offs_h)[None, :]; s0 = tl.load(Sin + start * HALF + offs_h)[None, :]
    b1 = bk1 * c0 - bk2 * s0; b2 = bk2 * c0 + bk1 * s0
    lk = tl.load(KL + (blk * R + offs_r)[None, :] * T + rows[:, None]).to(tl.float32) \
        * tl.load(KLS + blk * R + offs_r).to(tl.float32)[None, :] + tl.load(KLZ + blk * R + offs_r).to(tl.float32)[None, :]
    lk = lk.to(tl.float16)
    j_off = offs_n[:, None] * HALF + offs_h[None, :]
    cos_j = tl.load(Cos + j_off); sin_j = tl.load(Sin + j_off)
    if F16:
        k1 = tl.dot(lk, b1.to(tl.float16), out_dtype=tl.float16); k2 = tl.dot(lk, b2.to(tl.float16), out_dtype=tl.float16)
        cos_j = cos_j.to(tl.float16); sin_j = sin_j.to(tl.float16)
    else:
        k1 = tl.dot(lk, b1.to(tl.float16)); k2 = tl.dot(lk, b2.to(tl.float16))
    r1 = k1 * cos_j - k2 * sin_j; r2 = k2 * cos_j + k1 * sin_j
    s = tl.dot(qh1, tl.trans(r1.to(tl.float16))) + tl.dot(qh2, tl.trans(r2.to(tl.float16)))
    tl.store(S_lr + (b * H * G + h * G + offs_g)[:, None] * N + (start + offs_n)[None, :], s, mask=mg[:, None])
