"""Prefill attention probe (GPU): the tiles kernel at prefill shapes, by tile config, against SDPA. Qwen3-30B-A3B
attention: 32 q / 4 kv heads, D 128, bf16, paged fp16 cache of 16-token blocks (the served layout)."""
import json, sys, torch, torch.nn.functional as F, triton
sys.path.insert(0, ".")
import kernels.paged_attention as pa
torch.manual_seed(0)
dev, dt, Hq, Hkv, D, bs = "cuda", torch.bfloat16, 32, 4, 128, 16
rows = []
for P, n in [(0, 2048), (16384, 2048), (30720, 2048), (4096, 248)]:
    L = P + n
    nb = L // bs + 1
    k_cache = torch.randn(nb, bs, Hkv, D, device=dev, dtype=dt)
    v_cache = torch.randn(nb, bs, Hkv, D, device=dev, dtype=dt)
    perm = torch.randperm(nb, device=dev).to(torch.int32)
    q = torch.randn(n, Hq, D, device=dev, dtype=dt)
    tables = perm[None].expand(n, nb).contiguous()
    seq_lens = torch.arange(P + 1, L + 1, device=dev, dtype=torch.int32)
    flops = 4 * Hq * D * (n * P + n * (n + 1) / 2)
    for tile_rows, block_n, warps, stages in [(64, 32, 4, 2), (64, 64, 4, 2), (64, 64, 4, 3), (128, 32, 8, 2),
                                              (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (256, 64, 8, 2)]:
        pa.TILE_ROWS = tile_rows
        starts, counts = pa.query_tiles([n], Hq // Hkv)
        ts = torch.tensor(starts, dtype=torch.int32, device=dev); tc = torch.tensor(counts, dtype=torch.int32, device=dev)
        f = lambda: pa.paged_tiles_attention(q, k_cache, v_cache, tables, seq_lens, ts, tc, D ** -0.5,
                                             block_n=block_n, num_warps=warps, num_stages=stages)
        try:
            out = f(); ms = triton.testing.do_bench(f, warmup=5, rep=40)
        except Exception as e:
            print(P, n, tile_rows, block_n, warps, stages, "failed", str(e)[:100]); continue
        rows.append(dict(P=P, n=n, impl=f"tiles r{tile_rows} n{block_n} w{warps} s{stages}", ms=ms, tflops=flops / ms / 1e9))
    pa.TILE_ROWS = 64
    # SDPA as the engine's windowed per-sequence path does it now: history gathered, heads repeated, a bool mask
    def sdpa_masked():
        k = k_cache[perm.long()].flatten(0, 1)[:L].transpose(0, 1).repeat_interleave(Hq // Hkv, 0)
        v = v_cache[perm.long()].flatten(0, 1)[:L].transpose(0, 1).repeat_interleave(Hq // Hkv, 0)
        mask = torch.ones(n, L, dtype=torch.bool, device=dev).tril(diagonal=P)
        return F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None], v[None], attn_mask=mask)
    ms = triton.testing.do_bench(sdpa_masked, warmup=3, rep=30)
    rows.append(dict(P=P, n=n, impl="sdpa gather+repeat+mask", ms=ms, tflops=flops / ms / 1e9))
    def sdpa_gqa_masked():  # HEAD~2's path (math backend)
        k = k_cache[perm.long()].flatten(0, 1)[:L].transpose(0, 1)
        v = v_cache[perm.long()].flatten(0, 1)[:L].transpose(0, 1)
        mask = torch.ones(n, L, dtype=torch.bool, device=dev).tril(diagonal=P)
        return F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None], v[None], attn_mask=mask, enable_gqa=True)
    if L <= 20000:
        ms = triton.testing.do_bench(sdpa_gqa_masked, warmup=2, rep=10)
        rows.append(dict(P=P, n=n, impl="sdpa gqa+mask (before)", ms=ms, tflops=flops / ms / 1e9))
    # the ideal: flash over contiguous keys, causal only where the chunk is the whole context
    kc = torch.randn(1, Hkv, L, D, device=dev, dtype=dt); vc = torch.randn_like(kc)
    fl = lambda: F.scaled_dot_product_attention(q.transpose(0, 1)[None], kc, vc, is_causal=P == 0, enable_gqa=True)
    ms = triton.testing.do_bench(fl, warmup=5, rep=40)
    rows.append(dict(P=P, n=n, impl="flash contiguous" + (" causal" if P == 0 else " (no mask)"), ms=ms,
                     tflops=(flops if P == 0 else 4 * Hq * D * n * L) / ms / 1e9))
    del k_cache, v_cache, tables
for r in rows:
    print(f"P={r['P']:>6} n={r['n']:>5} {r['impl']:28} {r['ms']:8.3f} ms {r['tflops']:6.0f} TFLOP/s")
json.dump(rows, open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiles_probe.json", "w"), indent=1)
