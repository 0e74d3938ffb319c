"""SASS instructions of one address range (a loop that sass_loops.py lists) attributed to source lines, from the
line info of ./last.cubin (written by section 2h's sass_count.py). No GPU needed:

    python benchmarks/results/alrkvd_rotated_keys_2026-12-02/sass_count.py kernels.alrkvd_attention \
        _alrkvd_decode_stage1 "dict(..., BLOCK_N=128, num_warps=2)"
    python benchmarks/results/alrkvd_rotated_keys_2026-12-02/sass_loops.py          # the main loop: LO-HI
    python benchmarks/results/alrkvd_head_groups_2026-12-03/sass_lines.py LO HI [SOURCE.py]

How the shares in BENCHMARKS.md sections 2k and 2l (residual codes, basis and latents unpacked) were counted.
SOURCE.py: the kernel's source, to print its lines (default kernels/alrkvd_attention.py)."""
import collections, os, re, subprocess, sys

import triton

tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
dis = subprocess.run([tool, "--print-line-info", "-c", "last.cubin"], capture_output=True, text=True).stdout
lo, hi = (int(x, 16) for x in sys.argv[1:3])
source = sys.argv[3] if len(sys.argv) > 3 else "kernels/alrkvd_attention.py"
src = open(source).read().splitlines()
where, count, ops = None, collections.Counter(), collections.defaultdict(collections.Counter)
for line in dis.splitlines():
    m = re.search(r'//## File "([^"]+)", line (\d+)', line)
    if m:
        where = (os.path.basename(m.group(1)), int(m.group(2)))
        continue
    m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
    if m and lo <= int(m.group(1), 16) <= hi:
        count[where] += 1
        ops[where][m.group(3)] += 1
for key, n in count.most_common(40):
    text = src[key[1] - 1].strip()[:70] if key and key[0] == os.path.basename(source) else ""
    print(f"{n:5d} {key} {ops[key].most_common(4)} | {text}")
print("total", sum(count.values()))
