"""build_decode_meta's host time for decode rows (static buffers, as a CUDA graph step): B sequences at L tokens."""
import json, os, tempfile, time
import torch
from backend.engine import EngineArgs, LLMEngine
from backend.kv_cache import AttentionBatch, SeqKV
torch.set_num_threads(1)
shape = dict(model_type="qwen3_moe", vocab_size=256, hidden_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
             moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
             max_position_embeddings=40960)
d = tempfile.mkdtemp(); json.dump(shape, open(os.path.join(d, "config.json"), "w"))
eng = LLMEngine(EngineArgs(model=d, load_format="dummy", tokenizer="none", kv_format="fp16", max_num_seqs=32,
                           max_num_batched_tokens=2048, kv_budget_bytes=64 << 20, max_model_len=40960))
cache = eng.cache
static = cache.decode_buffers(32, 40960)
for B, L in ((1, 4096), (32, 4096), (8, 32768), (32, 32768)):
    bs = cache.block_size
    seqs = [SeqKV(block_table=list(range(i * 4000, i * 4000 + L // bs + 1)), num_tokens=L) for i in range(B)]
    batch = AttentionBatch(seqs, [1] * B)
    best = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(50):
            cache.build_decode_meta(batch, static)
        best.append((time.perf_counter() - t) / 50)
    print(f"B={B} L={L} (block {bs}): {1e6 * min(best):.0f} us")
# with a block appended to every sequence each step (the worst case: every step grows every table)
for B, L in ((8, 32768), (32, 32768)):
    seqs = [SeqKV(block_table=list(range(i * 4000, i * 4000 + L // 16 + 1)), num_tokens=L) for i in range(B)]
    batch = AttentionBatch(seqs, [1] * B)
    cache.build_decode_meta(batch, static)
    t = time.perf_counter()
    for k in range(50):
        for sq in seqs:
            sq.block_table.append(k)
        cache.build_decode_meta(batch, static)
    print(f"B={B} L={L}, every table growing each step: {1e6 * (time.perf_counter() - t) / 50:.0f} us")
