"""Expert reads a step with layered prefill against whole chunks, counted (not timed): Qwen3-30B-A3B's routing
structure (48 MoE layers, 128 experts, top 8, seeded routing as the GPU benchmarks use) on a dummy model of tiny
width, on the CPU. 8 streams decode; a 512-token prompt arrives at step 4. Each MoE call's distinct experts summed
over a step's calls (the decodes' and the chunk's are separate launches: each reads its experts) is what the step
reads in expert weights, in units of one expert (Qwen3-30B-A3B: 9.4 MB in bf16).

    PYTHONPATH=. .venv/bin/python benchmarks/results/layered_experts_cpu_2026-12-06/count.py
"""
import json
import tempfile

import torch

from backend.engine import EngineArgs, LLMEngine
from backend.model import MoE
from backend.sampling import SamplingParams

SHAPE = dict(model_type="qwen3_moe", vocab_size=1024, hidden_size=64, num_hidden_layers=48, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, intermediate_size=128, moe_intermediate_size=32, num_experts=128,
             num_experts_per_tok=8, norm_topk_prob=True, rms_norm_eps=1e-6, rope_theta=1e6,
             max_position_embeddings=4096, tie_word_embeddings=False)
folder = tempfile.mkdtemp()
json.dump(SHAPE, open(f"{folder}/config.json", "w"))
rows = {}
for groups in (0, 2, 4, 8):
    engine = LLMEngine(EngineArgs(model=folder, load_format="dummy", tokenizer="none", dtype="float32",
                                  kv_format="fp16", max_num_seqs=16, max_num_batched_tokens=2048,
                                  moe_routing="seeded", layered_prefill=groups))
    reads = [0]
    for m in engine.model.modules():
        if isinstance(m, MoE):
            m.register_forward_hook(lambda mod, inp, out: reads.__setitem__(0, reads[0] + mod.route(inp[0])[1]
                                                                             .unique().numel()))
    g = torch.Generator().manual_seed(0)
    for i in range(8):
        engine.add_request(None, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True),
                           prompt_ids=torch.randint(0, 1024, (30,), generator=g).tolist())
    steps = []
    for step in range(20):
        if step == 4:
            engine.add_request(None, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), request_id="doc",
                               prompt_ids=torch.randint(0, 1024, (512,), generator=g).tolist())
        reads[0] = 0
        engine.step()
        chunk = engine.layered_plan[1:] if engine.layered_plan else [n for s, n in engine.plan if n > 1]
        steps.append((step, len([1 for _, n in engine.plan if n == 1]), chunk, reads[0]))
    decode_only = [r for s, d, c, r in steps if s >= 1 and not c]
    with_prompt = [(c, r) for s, d, c, r in steps if s >= 4 and c]
    rows[groups] = {"decode_only_mean": sum(decode_only) / len(decode_only), "prompt_steps": with_prompt}
    print(f"layered_prefill={groups}: decode-only steps read {rows[groups]['decode_only_mean']:.0f} experts "
          f"(of {48 * 128}); steps with the prompt: {with_prompt}", flush=True)
print(json.dumps(rows))
