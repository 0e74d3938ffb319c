"""Writes the int8-residual prototype (and loads this folder's kernel files as modules, `load_module`): alrkvd_attention_before.py (the repository's kernel when it ran) with the
residual dots on int8 tensor cores
(K_BITS = V_BITS = 2, rotated keys only). A prototype for timing on the H200, not the repository's kernel.

- keys: the query is quantized per head to int8 (scale max|q| / 127) once per program; each run of residual codes
  is unpacked to int8 by inline PTX (shr + and on four bytes at once) and dotted in int32; the four runs share
  one accumulator (the codes are shifted down, so no power of two to take off).
- values: the residual codes are read tokens-contiguous ([H, NB, T] per block, stride_vrc), as the int8 B operand
  wants (four tokens of a column in one register); p * rscale is quantized per row to int8 and dotted in int32.
Usage: python make_prototype.py OUT.py (probe_int8.py writes it to a temporary folder itself)."""
import importlib.util
import sys
from pathlib import Path

src = (Path(__file__).resolve().parent / "alrkvd_attention_before.py").read_text()


def sub(old, new, count=1):
    global src
    assert src.count(old) == count, (old, src.count(old))
    src = src.replace(old, new)


sub("@triton.jit\ndef _s8_code(b):", '''@triton.jit
def _run8(b, SHIFT: tl.constexpr):
    """2-bit codes at bit SHIFT of every byte of b (uint8) as int8, four bytes per instruction pair."""
    if SHIFT == 0:
        return tl.inline_asm_elementwise("and.b32 $0, $1, 0x03030303;", "=r,r", [b], dtype=tl.int8,
                                         is_pure=True, pack=4)
    return tl.inline_asm_elementwise(f"{{ .reg .b32 t; shr.b32 t, $1, {SHIFT}; and.b32 $0, t, 0x03030303; }}",
                                     "=r,r", [b], dtype=tl.int8, is_pure=True, pack=4)


@triton.jit
def _q8(x, inv):
    """x * inv rounded to int8 (|x * inv| <= 127)."""
    y = x * inv
    return (y + tl.where(y >= 0, 0.5, -0.5)).to(tl.int8)


@triton.jit
def _s8_code(b):''')
sub("    stride_vrn, stride_vrt, stride_vrh,\n", "    stride_vrn, stride_vrt, stride_vrh, stride_vrc,\n")
# int8 queries of the residual runs
sub("""        q_sum = tl.sum(q1.to(tl.float32), 1) + tl.sum(q2.to(tl.float32), 1)
""", """        q_sum = tl.sum(q1.to(tl.float32), 1) + tl.sum(q2.to(tl.float32), 1)
        q_amax = tl.maximum(tl.max(tl.abs(q1.to(tl.float32)), 1), tl.max(tl.abs(q2.to(tl.float32)), 1))
        s_q = tl.maximum(q_amax, 1e-20) / 127.0
        inv_q = (1.0 / s_q)[:, None]
        qi0 = _q8(qk0.to(tl.float32), inv_q)
        qi1 = _q8(qk1.to(tl.float32), inv_q)
        qi2 = _q8(qk2.to(tl.float32), inv_q)
        qi3 = _q8(qk3.to(tl.float32), inv_q)
""")
sub("""            kc = _code_runs(tl.load(K_resid + block * stride_krn + kvh64 * stride_krh + rows[:, None] * stride_krt
                                    + offs_kc[None, :]), K_BITS)
            s_res = tl.dot(qk0, tl.trans(kc[0]))
            if PK >= 2:
                s_res += tl.dot(qk1, tl.trans(kc[1])) * (1.0 / (1 << K_BITS))
            if PK == 4:
                s_res += tl.dot(qk2, tl.trans(kc[2])) * (1.0 / 16) + tl.dot(qk3, tl.trans(kc[3])) * (1.0 / 64)
""", """            kb = tl.load(K_resid + block * stride_krn + kvh64 * stride_krh + rows[:, None] * stride_krt
                         + offs_kc[None, :])
            s_int = tl.dot(qi0, tl.trans(_run8(kb, 0)), out_dtype=tl.int32)
            s_int = tl.dot(qi1, tl.trans(_run8(kb, 2)), s_int, out_dtype=tl.int32)
            s_int = tl.dot(qi2, tl.trans(_run8(kb, 4)), s_int, out_dtype=tl.int32)
            s_int = tl.dot(qi3, tl.trans(_run8(kb, 6)), s_int, out_dtype=tl.int32)
            s_res = s_int.to(tl.float32) * s_q[:, None]
""")
sub("""            ps = (p * tl.load(V_rscale + vs_off).to(tl.float32)[None, :]).to(tl.float16)
""", """            ps = p * tl.load(V_rscale + vs_off).to(tl.float32)[None, :]
            s_p = tl.maximum(tl.max(ps, 1), 1e-30) / 127.0
            p8 = _q8(ps, (1.0 / s_p)[:, None])
            s_p = s_p[:, None]
""")
sub("""            vc = _code_runs(tl.load(V_resid + block * stride_vrn + kvh64 * stride_vrh + rows[:, None] * stride_vrt
                                    + offs_vc[None, :]), V_BITS)
""", """            vb = tl.load(V_resid + block * stride_vrn + kvh64 * stride_vrh + rows[:, None] * stride_vrt
                         + offs_vc[None, :] * stride_vrc)
""")
sub("acc0 = acc0 * alpha[:, None] + tl.dot(ps, vc[0]) + p_zero", "acc0 = acc0 * alpha[:, None] + tl.dot(p8, _run8(vb, 0), out_dtype=tl.int32).to(tl.float32) * s_p + p_zero")
sub("acc1 = acc1 * alpha[:, None] + tl.dot(ps, vc[1]) * (1.0 / (1 << V_BITS)) + p_zero", "acc1 = acc1 * alpha[:, None] + tl.dot(p8, _run8(vb, 2), out_dtype=tl.int32).to(tl.float32) * s_p + p_zero")
sub("acc2 = acc2 * alpha[:, None] + tl.dot(ps, vc[2]) * (1.0 / 16) + p_zero", "acc2 = acc2 * alpha[:, None] + tl.dot(p8, _run8(vb, 4), out_dtype=tl.int32).to(tl.float32) * s_p + p_zero")
sub("acc3 = acc3 * alpha[:, None] + tl.dot(ps, vc[3]) * (1.0 / 64) + p_zero", "acc3 = acc3 * alpha[:, None] + tl.dot(p8, _run8(vb, 6), out_dtype=tl.int32).to(tl.float32) * s_p + p_zero")
sub("""        cache.v_resid.stride(0), cache.v_resid.stride(1), cache.v_resid.stride(2),
""", """        cache.v_resid.stride(0), cache.v_resid.stride(1), cache.v_resid.stride(2), cache.v_resid.stride(3),
""")
sub("""    for t in (cache.basis, cache.k_resid, cache.v_resid, cache.ranks,""", """    for t in (cache.basis, cache.k_resid, cache.ranks,""")


def write_prototype(path) -> None:
    Path(path).write_text(src)


def load_module(name: str, path):
    """A kernel file (this folder's alrkvd_attention_before.py, or the written prototype) as module `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    write_prototype(sys.argv[1])
