import sys, torch
sys.path.insert(0, '.')  # run from the repository root
def free(tag):
    torch.cuda.synchronize(); print(f"{tag:45s} free {torch.cuda.mem_get_info()[0]/1e9:8.3f} GB reserved {torch.cuda.memory_reserved()/1e9:.3f}", flush=True)
free("start")
from benchmarks.bench_basis import compress_step
compress_step(1, 1); free("alrkvd_compress, 1 block (Qwen3 shape)")
from benchmarks.bench_attention import make_alrkvd, VARIANTS
from kernels.alrkvd_attention import alrkvd_decode_attention
gen = torch.Generator().manual_seed(0)
kw, _ = make_alrkvd(1, 4096, 8, 128, 128, *VARIANTS["alrkvd-r16"], "cuda", gen)
free("synthetic alrkvd cache")
q = torch.randn(1, 32, 128, device="cuda", dtype=torch.float16)
alrkvd_decode_attention(q, scale=128 ** -0.5, **kw); free("alrkvd decode kernel")
from kernels.paged_attention import paged_decode_attention
free("end")
