"""The encode of 30 ALR-KVD blocks (one a layer, random data) on the CPU with the `eigh` basis and the `subspace`
basis, in turns (journal 2026-12-05 22b). Run from the repository root with PYTHONPATH=."""
import sys, time, torch
from backend.engine import EngineArgs, LLMEngine
from backend.kv_presets import resolve_kv
torch.manual_seed(0)
blocks = [(l, 5, 320, torch.randn(64, 3, 64), torch.randn(64, 3, 64)) for l in range(30)]
for solver in ("eigh", "subspace", "eigh", "subspace"):
    kv, opts = resolve_kv("alrkvd-cpu", {"basis_solver": solver})
    eng = LLMEngine(EngineArgs(model="default", weight_dtype="float16", kv_format=kv, kv_options=opts,
                               kv_budget_bytes=128 << 20, max_model_len=2048, max_num_seqs=8))
    f = eng.cache.format
    f.encode_blocks(blocks)
    t = time.perf_counter()
    for _ in range(5): f.encode_blocks(blocks)
    print(solver, "encode of 30 blocks", round((time.perf_counter() - t) / 5 * 1e3, 1), "ms")
