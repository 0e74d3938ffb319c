"""Usage (repo root, no GPU needed):
    python benchmarks/sass_count.py kernels.alrkvd_attention \
        _alrkvd_decode_stage1 "dict(ROTATED_KEYS=True, num_warps=2)"
It prints the whole kernel's counts, then each loop (a backward branch) with its address range, instruction count
and the opcodes that matter for the ALR-KVD loop (barriers, shared-memory traffic, spills): the main loop is the
second. Then benchmarks/results/alrkvd_head_groups_2026-12-03/sass_lines.py LO HI gives a loop's shares by source line.
The ALR-KVD stage 1 as it stands (section 2h's benchmarks/results/alrkvd_rotated_keys_2026-12-02/sass_count.py
brought up to section 2n's kernel): BLOCK_GN, the values' codes stored token-contiguous
(stride_vrt=1, stride_vrc=T), 128-token tiles and 4-row groups by default. Compiles an ALR-KVD stage 1 for sm_90
the way the JIT specializes it (pointers 16-aligned, ints == 1 constexpr, ints % 16 == 0 marked divisible), dumps
SASS, counts instructions by opcode; prints the registers, the static and the dynamic shared memory."""
import os, subprocess, sys, tempfile, collections, re, importlib, json
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[1]))  # the repo root
modname, fnname = sys.argv[1], sys.argv[2]
extra = eval(sys.argv[3]) if len(sys.argv) > 3 else {}
mod = importlib.import_module(modname)
fn = getattr(mod, fnname)
ptr = dict(Q="fp16", Block_tables="i32", Seq_lens="i32", Closed="i32", Window_slots="i32", Window_k="fp16",
           Window_v="fp16", Cos="fp32", Sin="fp32", Ranks="i16", Basis="i8", Basis_scale="fp16",
           Latent="u8", Latent_scale="fp16", Latent_zero="fp16", K_resid="u8", K_rscale="fp16",
           K_rzero="fp16", V_resid="u8", V_rscale="fp16", V_rzero="fp16", Mid_o="fp32", Mid_lse="fp32", Out="fp16",
           Tickets="i32", Tile_starts="i32", Tile_counts="i32")
T, H, D, R, P, Hq = 128, 8, 128, 256, 9, 32
ints = dict(num_splits=8, stride_qb=Hq * D, stride_qh=D, stride_btb=257, stride_cs=D,
            stride_wn=T * H * D, stride_wt=H * D, stride_wh=D, stride_rkn=16, stride_bn=R * D, stride_br=D,
            stride_bsn=R, stride_ln=T * R, stride_lt=1, stride_lr=T,
            stride_krn=T * H * 32, stride_krt=32, stride_krh=T * 32, stride_ksn=T * H, stride_kst=1, stride_ksh=T,
            stride_vrn=T * H * 32, stride_vrt=1, stride_vrh=32 * T, stride_vrc=T, stride_vsn=T * H, stride_vst=1, stride_vsh=T,
            stride_mob=Hq * P * D, stride_moh=P * D, stride_mos=D, stride_mlb=Hq * P, stride_mlh=P, stride_ob=Hq * D, stride_oh=D)
consts = dict(NUM_KV_HEADS=8, GROUP=4, BLOCK_G=4, BLOCK_GN=8, MERGE_CHUNK=32, MIN_TILES=1, ASM=True, HEAD_DIM=128, BLOCK_SIZE=128, BLOCK_S=16, K_BITS=2, V_BITS=2,
              BLOCK_N=128, WINDOW_N=128, BLOCK_R=16, HAS_CLOSED=False, TILE_Q=1)
opts = dict(num_warps=4, num_stages=2)
for k, v in extra.items():
    (opts if k in ('num_warps', 'num_stages', 'maxnreg') else ints if k in ints or k.startswith('stride') else consts)[k] = v
sig, cx, attrs = {}, {}, {}
for i, p in enumerate(fn.params):
    n = p.name
    if n in consts:
        sig[n] = "constexpr"; cx[(i,)] = consts[n]
    elif n in ptr:
        sig[n] = "*" + ptr[n]; attrs[(i,)] = [["tt.divisibility", 16]]
    elif n == "qk_scale":
        sig[n] = "fp32"
    else:
        v = ints[n]
        if v == 1:
            sig[n] = "constexpr"; cx[(i,)] = 1
        else:
            sig[n] = "i32"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
c = triton.compile(ASTSource(fn, sig, constexprs=cx, attrs=attrs), target=GPUTarget("cuda", 90, 32), options=opts)
bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
    f.write(c.asm["cubin"])
usage = subprocess.run([bindir + "/cuobjdump", "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
sass = subprocess.run([bindir + "/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
open('last.sass', 'w').write(sass)
open('last.ttgir', 'w').write(c.asm["ttgir"])
open('last.cubin', 'wb').write(c.asm["cubin"])  # for sass_lines.py (benchmarks/results/alrkvd_head_groups_2026-12-03/)
lines = [l for l in sass.splitlines() if re.match(r'\s+/\*[0-9a-f]{4,}\*/', l)]
ops = collections.Counter()
mem = collections.Counter()
for l in lines:
    m = re.match(r'\s+/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)', l)
    if m:
        ops[m.group(2).split('.')[0]] += 1
        if m.group(2).startswith(('LD', 'ST')): mem[m.group(2)] += 1
print(" ".join(l.strip() for l in usage.splitlines() if "REG" in l), "DYNAMIC_SHARED:%d" % c.metadata.shared,
      "| total", len(lines))
print(ops.most_common(24))
print(mem.most_common(16))
# loops: the instructions from a backward branch's target to the branch
ins = [(int(m.group(1), 16), m.group(2))
       for m in (re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?);', l) for l in lines) if m]
index = {a: i for i, (a, _) in enumerate(ins)}
for i, (a, text) in enumerate(ins):
    target = re.search(r'BRA.*?0x([0-9a-f]+)', text)
    if target and int(target.group(1), 16) < a and int(target.group(1), 16) in index:
        body = ins[index[int(target.group(1), 16)]:i + 1]
        n = collections.Counter(re.match(r'(@!?U?P\w+\s+)?([A-Z0-9_]+)', t).group(2) for _, t in body)
        print(f"loop {body[0][0]:#x}-{a:#x}: {len(body)} instructions,",
              " ".join(f"{k}={n[k]}" for k in ("BAR", "HMMA", "LOP3", "PRMT", "SHFL", "LDS", "LDSM", "STS",
                                                  "STSM", "LDG", "LDGSTS", "LDL", "STL")))
