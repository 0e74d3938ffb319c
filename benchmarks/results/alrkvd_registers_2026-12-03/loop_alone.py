"""Section 2r's "what holds the registers": the ALR-KVD stage 1 with its window branch and its merge cut out (the main
loop alone), compiled for sm_90 on the CPU by benchmarks/sass_count.py, as it is and under register caps. From the
repository root:

    python benchmarks/results/alrkvd_registers_2026-12-03/loop_alone.py [MAXNREG ...]   # default: none 232 200 168

Prints, per cap, the build's registers and spill stack and the main loop's SASS counts (LDL: spill reloads)."""
import os
import subprocess
import sys
import tempfile

root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
src = open(os.path.join(root, "kernels", "alrkvd_attention.py")).read()
a = src.index("        offs_w = tl.arange(0, WINDOW_N)")  # the window's loop ...
b = src.index("        store_partial(o_row, lse_row, acc, m_i, l_i, heads")  # ... up to its store
src = src[:a] + src[b:]
m0 = src.index("    merge_if_last(Tickets")
src = src[:m0] + "\n\n" + src[src.index("# ----", m0):]
tmp = tempfile.mkdtemp()
open(os.path.join(tmp, "alr_loop_alone.py"), "w").write(src)
env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, root]))
for cap in sys.argv[1:] or ["none", "232", "200", "168"]:
    extra = "" if cap == "none" else f", maxnreg={cap}"
    out = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "sass_count.py"), "alr_loop_alone",
                          "_alrkvd_decode_stage1", f"dict(ROTATED_KEYS=True, num_warps=2, BLOCK_N=128{extra})"],
                         cwd=tmp, env=env, capture_output=True, text=True).stdout.splitlines()
    print(f"maxnreg {cap}:", *[line for line in out if line.startswith("REG") or line.startswith("loop")], sep="\n  ")
