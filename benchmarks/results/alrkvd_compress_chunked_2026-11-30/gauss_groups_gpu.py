"""One-off check on the GPU: the compression kernel with the gauss codebook, 3-4 bits, group < head_dim (refused
since 2026-11-29 after wrong codes compiled on the H200), after the token-chunked rewrite. The refusal is lifted
in a copy of the module; the tests' comparison with encode is run on those cases."""
import sys, types, torch
sys.path.insert(0, '.'); sys.path.insert(0, 'tests')
src = open('kernels/alrkvd_compress.py').read()
a = src.index('    if o["codebook"] == "gauss" and o["group"] < D')
b = src.index('    assert k.shape == v.shape')
mod = types.ModuleType("kernels.alrkvd_compress"); mod.__file__ = 'kernels/alrkvd_compress.py'
sys.modules["kernels.alrkvd_compress"] = mod
exec(compile(src[:a] + src[b:], 'kernels/alrkvd_compress.py', 'exec'), mod.__dict__)
import test_kernels_alrkvd_compress as t
from kernels.testing import random_kv
ok = True
for opts in [dict(k_bits=4, v_bits=4, group=32), dict(k_bits=3, v_bits=4, group=16), dict(k_bits=4, v_bits=2, group=32, rotate="false")]:
    gen = torch.Generator().manual_seed(7)
    k = random_kv((3, 32, 2, 64), torch.float16, gen); v = random_kv((3, 32, 2, 64), torch.float16, gen, channel_outliers=0)
    try:
        t._compare(k, v, [4, 1, 2], num_blocks=6, **opts); print("ok", opts)
    except AssertionError as e:
        ok = False; print("FAIL", opts, str(e)[:200])
print("all ok" if ok else "some failed")
