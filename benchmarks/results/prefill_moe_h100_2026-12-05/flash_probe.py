"""Does SDPA with causal_lower_right + GQA take flash on this GPU? speed/memory vs tiles kernel and masked SDPA."""
import sys, torch, torch.nn.functional as F, triton
from torch.nn.attention.bias import causal_lower_right
sys.path.insert(0, ".")
import kernels.paged_attention as pa
torch.manual_seed(0)
dev, dt, Hq, Hkv, D, bs = "cuda", torch.bfloat16, 32, 4, 128, 16
print(torch.__version__, torch.cuda.get_device_name())
for P, n in [(0, 2048), (16384, 2048), (30720, 2048), (4096, 256), (4096, 64)]:
    L = P + n; nb = L // bs + 1
    k_cache = torch.randn(nb, bs, Hkv, D, device=dev, dtype=dt); v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(nb, device=dev).to(torch.int32)
    q = torch.randn(n, Hq, D, device=dev, dtype=dt)
    tables = perm[None].expand(n, nb).contiguous()
    seq_lens = torch.arange(P + 1, L + 1, device=dev, dtype=torch.int32)
    flops = 4 * Hq * D * (n * P + n * (n + 1) / 2)
    starts, counts = pa.query_tiles([n], Hq // Hkv)
    ts = torch.tensor(starts, dtype=torch.int32, device=dev); tc = torch.tensor(counts, dtype=torch.int32, device=dev)
    tiles = lambda: pa.paged_tiles_attention(q, k_cache, v_cache, tables, seq_lens, ts, tc, D ** -0.5)
    def flash():
        k = k_cache[perm.long()].flatten(0, 1)[:L].transpose(0, 1)
        v = v_cache[perm.long()].flatten(0, 1)[:L].transpose(0, 1)
        return F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None], v[None],
                                              attn_mask=causal_lower_right(n, L), enable_gqa=True)[0].transpose(0, 1)
    ref = tiles(); out = flash()
    err = (ref.float() - out.float()).abs().max().item()
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
    flash(); torch.cuda.synchronize(); peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    t_tiles = triton.testing.do_bench(tiles, warmup=5, rep=40); t_flash = triton.testing.do_bench(flash, warmup=5, rep=40)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        flash(); torch.cuda.synchronize()
    names = sorted({e.name[:60] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    print(f"P={P:6} n={n:5} err={err:.4f} tiles {t_tiles:.3f} ms {flops/t_tiles/1e9:5.0f} TF/s | flash+gather "
          f"{t_flash:.3f} ms {flops/t_flash/1e9:5.0f} TF/s | peak {peak:.0f} MiB | {names}")
