"""Aten ops (host launches on CUDA) of PagedKVCache.write in one eager step with a chunk across many blocks."""
import json, sys, tempfile, os, time
import torch
from torch.profiler import profile, ProfilerActivity, record_function
from backend.engine import EngineArgs, LLMEngine
from backend.sampling import SamplingParams
from kernels.alrkvd_attention import kernel_options
QWEN3 = dict(model_type="qwen3_moe", vocab_size=512, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, intermediate_size=256, moe_intermediate_size=64, num_experts=8,
             num_experts_per_tok=2, norm_topk_prob=True, rms_norm_eps=1e-6, rope_theta=1e6,
             max_position_embeddings=8192, tie_word_embeddings=False)
d = tempfile.mkdtemp(); open(os.path.join(d, "config.json"), "w").write(json.dumps(QWEN3))
eng = LLMEngine(EngineArgs(model=d, load_format="dummy", tokenizer="none", device="cpu", dtype="float32",
                           kv_format="alrkvd", kv_options=kernel_options(64, block_size=64), max_num_seqs=4,
                           max_num_batched_tokens=4096, enforce_eager=True))
cache = eng.cache
cache.defer_prompt_blocks = True  # as on CUDA
write = cache.write
def traced(*a, **k):
    with record_function("cache.write"):
        return write(*a, **k)
cache.write = traced
p = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
eng.add_request(None, p, prompt_ids=[1] * 100)
eng.step()
eng.add_request(None, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True), prompt_ids=[2] * 2048)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    t = time.perf_counter(); eng.step(); dt = time.perf_counter() - t
ev = prof.events()
w = [e for e in ev if e.name == "cache.write"]
def in_write(e):
    return any(x.time_range.start <= e.time_range.start and e.time_range.end <= x.time_range.end for x in w)
inside = sum(1 for e in ev if e.name.startswith("aten::") and in_write(e))
total = sum(1 for e in ev if e.name.startswith("aten::"))
print(f"plan {sorted(n for _, n in eng.plan)}: aten ops in write {inside} of {total}; step {dt*1e3:.0f} ms")
from collections import Counter
c = Counter(e.name for e in ev if e.name.startswith("aten::") and in_write(e))
print(c.most_common(12))
c2 = Counter(e.name for e in ev if e.name.startswith("aten::"))
print(c2.most_common(15))
