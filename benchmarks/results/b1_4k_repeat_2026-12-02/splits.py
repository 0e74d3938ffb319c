"""ALR-KVD rank 16 at B=1 L=4k (32 query / 8 kv heads, head_dim 128, block 128) with the split count forced, against
FP16 SDPA, each timed as bench_attention.py times it (CUDA-graph replays over copies that exceed twice the L2),
alternated over three rounds. The default launch takes 33 splits there (the table's 33 columns at 128 tokens a
split) for 62 closed tiles, so 2 splits are empty and the merge reads 34 partials in chunks of 32. (Measured on
the kernel before the busy-splits change; since it, a split takes at least two tiles and the merge reads only the
busy splits' partials, so counts above 31 run as 31 here.)
Usage (repository root): python benchmarks/results/b1_4k_repeat_2026-12-02/splits.py OUT.json"""
import json, statistics, sys
import torch
sys.path.insert(0, ".")
from benchmarks.bench_attention import VARIANTS, make_alrkvd, num_copies, sdpa_call, time_calls
from kernels.alrkvd_attention import alrkvd_decode_attention

B, L, Hq, Hkv, D, T = 1, 4096, 32, 8, 128, 128
gen = torch.Generator().manual_seed(0)
scale = D ** -0.5
q = torch.randn(B, Hq, D, device="cuda", dtype=torch.float16)
first, nbytes = make_alrkvd(B, L, Hkv, D, T, *VARIANTS["alrkvd-r16"], "cuda", gen)
layers = [first] + [make_alrkvd(B, L, Hkv, D, T, *VARIANTS["alrkvd-r16"], "cuda", gen)[0]
                    for _ in range(num_copies(nbytes, "cuda") - 1)]
sdpa = [sdpa_call(torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.float16),
                  *(torch.randn(B, Hkv, L, D, device="cuda", dtype=torch.float16) for _ in range(2)))
        for _ in range(num_copies(2 * B * Hkv * L * D * 2, "cuda"))]
ref = alrkvd_decode_attention(q, scale=scale, **first)
results = {}
for _ in range(3):
    results.setdefault("sdpa", []).append(time_calls(sdpa, "cuda") * 1e6)
    for splits in (None, 15, 16, 21, 31, 32, 33, 62, 63):
        out = alrkvd_decode_attention(q, scale=scale, num_splits=splits, **first)
        assert (out.float() - ref.float()).abs().max().item() < 2e-3, splits
        calls = [lambda kw=kw, s=splits: alrkvd_decode_attention(q, scale=scale, num_splits=s, **kw) for kw in layers]
        results.setdefault(str(splits or "default"), []).append(time_calls(calls, "cuda") * 1e6)
json.dump(results, open(sys.argv[1], "w"), indent=1)
base = statistics.median(results["sdpa"])
print("splits | us (3 rounds) | SDPA / this (medians)")
for k, v in results.items():
    print(f"{k} | {' / '.join(f'{x:.1f}' for x in v)} | {base / statistics.median(v):.3f}x")
