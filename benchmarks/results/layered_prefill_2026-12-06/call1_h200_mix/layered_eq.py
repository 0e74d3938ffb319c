"""GPU smoke: layered prefill on CUDA (graph replay of decodes, then eager layer groups) gives the plain run's greedy
tokens on a small dummy MoE. Prints agreement per KV format."""
import json, sys, tempfile, os
import torch
sys.path.insert(0, ".")
from backend.engine import EngineArgs, LLMEngine
from backend.sampling import SamplingParams
from benchmarks.bench_engine import kernel_format

CFG = dict(model_type="qwen3_moe", vocab_size=512, hidden_size=256, num_hidden_layers=8, num_attention_heads=4,
           num_key_value_heads=2, head_dim=128, intermediate_size=512, moe_intermediate_size=128, num_experts=16,
           num_experts_per_tok=4, norm_topk_prob=True, rms_norm_eps=1e-6, rope_theta=1e6,
           max_position_embeddings=4096, tie_word_embeddings=False)
folder = tempfile.mkdtemp()
open(os.path.join(folder, "config.json"), "w").write(json.dumps(CFG))
g = torch.Generator().manual_seed(0)
chat, doc, doc2 = (torch.randint(0, 512, (n,), generator=g).tolist() for n in (30, 700, 300))
for fmt in ("fp16", "alrkvd-gpu"):
    for dtype in ("float32", "bfloat16"):
        outs = []
        for groups in (0, 4):
            kv_format, kv_options = kernel_format(fmt, 128)
            try:
                e = LLMEngine(EngineArgs(model=folder, load_format="dummy", tokenizer="none", device="cuda", dtype=dtype,
                                         kv_format=kv_format, kv_options=kv_options, max_num_seqs=8,
                                         max_num_batched_tokens=256, max_model_len=2048, layered_prefill=groups))
                e.graphs.capture_all()
                sp = lambda n: SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
                e.add_request(None, sp(40), request_id="chat", prompt_ids=chat)
                out, layered_steps = {}, 0
                for step in range(200):
                    if step == 3:
                        e.add_request(None, sp(8), request_id="doc", prompt_ids=doc)
                        e.add_request(None, sp(8), request_id="doc2", prompt_ids=doc2)
                    out.update((o.request_id, list(o.token_ids)) for o in e.step())
                    layered_steps += e.layered_plan is not None
                    if not e.requests:
                        break
                outs.append(out)
                print(f"{fmt} {dtype} G={groups}: {layered_steps} layered steps, done at step {step}", flush=True)
                del e
                torch.cuda.empty_cache()
            except Exception as ex:
                import traceback; traceback.print_exc()
                print(f"{fmt} {dtype} G={groups}: FAILED {ex!r}", flush=True)
                outs.append(None)
        if None not in outs:
            same = {k: sum(a == b for a, b in zip(outs[0][k], outs[1][k])) / len(outs[0][k]) for k in outs[0]}
            print(f"EQ {fmt} {dtype}: fraction of equal tokens {same}", flush=True)
