"""Ceiling probes of the ALR-KVD decode kernel (rotated keys, 2-bit residuals): copies of kernels/alrkvd_attention.py
with parts of the main loop cut out, to time on the H200 against the kernel as it is (compare_kernels.py arms
NAME@FILE.py). Their outputs are not attention (no check); they bound what a kernel on this format could gain.

    python benchmarks/results/alrkvd_ceiling_2026-12-03/make_probes.py OUTDIR

probe_resid.py:   only the residuals: key residual dots, softmax, value residual dots (no latents, no basis, no
                  stream scales in the loop). Reads 576 of the format's 1,100 bytes per token (rank 16).
probe_noblock.py: the whole loop but the per-block basis work: q B^T and the four up-projection operands are built
                  once per program from its first block, as a basis shared by every block of a split would allow.
                  Reads 844 of the 1,100 bytes per token (no basis bytes in the loop).
probe_unpack.py:  probe_resid without the softmax and the column sums: the residuals' codes loaded, unpacked and multiplied
                  (key dots, then value dots weighted by the scores times the scales), nothing else.
probe_resid_r168.py, probe_resid_r128.py, probe_resid_w4.py: probe_resid launched with a register cap of 168 or 128
                  (6 or 8 programs per SM) or with 4 warps (2 per SM) where the kernel takes 2.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SRC = (ROOT / "kernels" / "alrkvd_attention.py").read_text()


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"expected one match of {old[:60]!r}, found {text.count(old)}"
    return text.replace(old, new)


LOOP = "        for t in range(t_start, t_end):\n"
QB = ("                qb = tl.dot(_byte_code(bk1, True, ASM), q1t) * bks + tl.dot(_byte_code(bk2, True, ASM), q2t) * bks \\\n"
      "                    - 1152.0 * q_sum[None, :] * bks\n")
BK_LOADS = ("            bk1 = _load_2d(basis_blk + off_k * stride_br, offs_r, offs_h, mk, offs_h < HALF, stride_br, 1)\n"
            "            bk2 = _load_2d(basis_blk + off_k * stride_br + HALF, offs_r, offs_h, mk, offs_h < HALF, stride_br, 1)\n")
BV = ["bv = _byte_code(_load_2d(bv_blk, offs_vc, offs_r, offs_vc < NV, mv, 1, stride_br), True, ASM)"] + [
    f"bv = _byte_code(_load_2d(bv_blk + {k}NV, offs_vc, offs_r, offs_vc < NV, mv, 1, stride_br), True, ASM)"
    for k in ("", "2 * ", "3 * ")]


def noblock(src: str) -> str:
    hoist = (
        "        off_k0, mk0, off_v0, mv0 = _stream_rows(next_rk, offs_s, offs_r, pid_kvh, NUM_KV_HEADS)\n"
        "        basis0 = Basis + next_block * stride_bn\n"
        "        bks0 = bk_s.to(tl.float32)[:, None]\n"
        "        qb0 = tl.dot(_byte_code(_load_2d(basis0 + off_k0 * stride_br, offs_r, offs_h, mk0, offs_h < HALF,\n"
        "                                         stride_br, 1), True, ASM), q1t) * bks0 \\\n"
        "            + tl.dot(_byte_code(_load_2d(basis0 + off_k0 * stride_br + HALF, offs_r, offs_h, mk0, offs_h < HALF,\n"
        "                                         stride_br, 1), True, ASM), q2t) * bks0 - 1152.0 * q_sum[None, :] * bks0\n"
        "        bv_blk0 = basis0 + off_v0 * stride_br\n")
    for i, k in enumerate(("", " + NV", " + 2 * NV", " + 3 * NV")):
        hoist += (f"        bv{i} = _byte_code(_load_2d(bv_blk0{k}, offs_vc, offs_r, offs_vc < NV, mv0, 1, stride_br),"
                  " True, ASM)\n")
    src = edit(src, LOOP, hoist + LOOP)
    src = edit(src, BK_LOADS, "")
    src = edit(src, QB, "                qb = qb0\n")
    src = src.replace("bk1 = (_byte_code(bk1, True, ASM)", "bk1 = (_byte_code(qb0, True, ASM)")  # post_rope: unused
    src = src.replace("bk2 = (_byte_code(bk2, True, ASM)", "bk2 = (_byte_code(qb0, True, ASM)")
    for i, old in enumerate(BV):
        src = edit(src, old, f"bv = bv{i}")
    return src


def resid(src: str) -> str:
    src = edit(src, BK_LOADS, "")
    src = edit(src, "            lk = _load_2d(lat_blk + off_k * stride_lr, rows, offs_r, all_n, mk, stride_lt, stride_lr)\n", "")
    start = src.index("                bks = bk_s.to(tl.float32)[:, None]\n")
    end = src.index("            else:\n                # the basis rotated to the tile's first position")
    src = src[:start] + "                s_low = tl.zeros([BLOCK_N, BLOCK_GN], dtype=tl.float32)\n" + src[end:]
    start = src.index("            lv = _load_2d(lat_blk + off_v * stride_lr")
    end = src.index("            v_bytes = tl.load(V_resid")
    src = src[:start] + "            low_zero = rz_sum\n" + src[end:]
    for old in BV:
        src = edit(src, old, "bv = 0")
    src = edit(src, "acc0 = tl.dot(bv, p_lat, tl.dot(vc[0], ps, acc0 * alpha[None, :]))",
               "acc0 = tl.dot(vc[0], ps, acc0 * alpha[None, :])")
    src = edit(src, "acc1 = tl.dot(bv, (p_lat * (1 << V_BITS)).to(tl.float16),\n                              tl.dot(vc[1], ps, acc1 * alpha[None, :]))",
               "acc1 = tl.dot(vc[1], ps, acc1 * alpha[None, :])")
    src = edit(src, "acc2 = tl.dot(bv, (p_lat * 16).to(tl.float16),\n                              tl.dot(vc[2], ps, acc2 * alpha[None, :]))",
               "acc2 = tl.dot(vc[2], ps, acc2 * alpha[None, :])")
    src = edit(src, "acc3 = tl.dot(bv, (p_lat * 64).to(tl.float16),\n                              tl.dot(vc[3], ps, acc3 * alpha[None, :]))",
               "acc3 = tl.dot(vc[3], ps, acc3 * alpha[None, :])")
    src = edit(src, "                bk_s, lk_s, lk_z, bv_s, lv_s, lv_z = _stream_scales(\n"
                    "                    next_block, next_rk, offs_s, offs_r, pid_kvh, Basis_scale, Latent_scale, Latent_zero, stride_bsn,\n"
                    "                    NUM_KV_HEADS)\n", "")
    return src


def unpack(src: str) -> str:
    src = edit(src, "            p, alpha, m_i, l_r = softmax_update(s * qk_scale, all_n, m_i, l_r, 0, ADD_SUM=False)\n",
               "            p, alpha = s * qk_scale, tl.full([BLOCK_GN], 1.0, tl.float32)\n")
    src = edit(src, "            l_r += p_sum\n", "")
    for name in ("p_sum", "ps_bias", "rz_sum"):
        start = src.index(f"            {name} = ")
        src = src[:start] + f"            {name} = 0.0\n" + src[src.index("\n", start) + 1:]
    return src


def launch(src: str, extra: str) -> str:
    return edit(src, '"NUM_WARPS_MANY_PAIRS": 2,', '"NUM_WARPS_MANY_PAIRS": 2, ' + extra + ",")


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe_noblock.py").write_text(noblock(SRC))
    (out / "probe_resid.py").write_text(resid(SRC))
    (out / "probe_unpack.py").write_text(unpack(resid(SRC)))
    (out / "probe_resid_r168.py").write_text(launch(resid(SRC), '"maxnreg": 168'))
    (out / "probe_resid_r128.py").write_text(launch(resid(SRC), '"maxnreg": 128'))
    (out / "probe_resid_w4.py").write_text(resid(SRC).replace('"NUM_WARPS_MANY_PAIRS": 2,', '"NUM_WARPS_MANY_PAIRS": 4,'))
