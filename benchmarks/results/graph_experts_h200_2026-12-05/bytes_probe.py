"""Experts copied per layer and step by the device-decided cache (its exact bookkeeping, PyTorch references on the
CPU) under local routing, prefetch on/off, LRU/LFU, for 12 layers of the Qwen3-30B-A3B expert layout (hidden size
shrunk: only the bookkeeping counts). Journal 2026-12-05 13a.
    .venv/bin/python benchmarks/results/graph_experts_h200_2026-12-05/bytes_probe.py > bytes_probe_cpu.txt
"""
import sys; sys.path.insert(0, "benchmarks")
from kernels.testing import use_interpreter_without_gpu
use_interpreter_without_gpu()
import torch
import bench_experts as be
from backend.config import ModelConfig
from backend.experts import ExpertStore
from backend.graph_experts import DeviceExpertCache
hf = dict(be.MODELS["qwen3-30b-a3b"][0], hidden_size=64, moe_intermediate_size=16)
cfg = ModelConfig.from_hf(hf)
L, steps = 12, 150
store = ExpertStore.dummy(range(L), 128, 64, 16, torch.float32, pin=False)
for frac in (0.5, 0.25):
  for batch in (1, 8):
    for prefetch, policy in ((True, "lru"), (False, "lru"), (False, "lfu"), (True, "lfu")):
        model = be.MoESlice(cfg, L, "cpu", torch.float32, seed=1)
        model.route_locally(batch, seed=2)
        cache = DeviceExpertCache(store, {i: m.prefetch_logits for i, m in enumerate(model.moes)}, 8,
                                  int(frac * 128) * store.expert_bytes * L, "cpu", prefetch, policy)
        for i, m in enumerate(model.moes): m.experts = cache.layer(i)
        for step in range(steps):
            model.next_keys()
            with torch.no_grad():
                model(torch.randn(batch, 64))
            if step == 19: cache.reset_stats()
        st = cache.stats()
        copies = (st["expert_misses"] + st["expert_prefetch_copies"]) / L / (steps - 20)
        print(f"budget {frac} B={batch} prefetch {prefetch!s:5} {policy}: hit {st['expert_hit_rate']:.3f} "
              f"on demand {st['expert_misses'] / L / (steps - 20):.2f} prefetched {st['expert_prefetch_copies'] / L / (steps - 20):.2f} "
              f"copies/layer/step {copies:.2f}", flush=True)
