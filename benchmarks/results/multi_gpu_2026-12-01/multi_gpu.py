"""An engine on the second GPU (a Triton model instance on GPU 1) gives the tokens of one on the first, with decode
CUDA graphs and without, and allocates nothing on GPU 0. Needs two GPUs:

    python benchmarks/results/multi_gpu_2026-12-01/multi_gpu.py            # the engine as it is
    python benchmarks/results/multi_gpu_2026-12-01/multi_gpu.py --no-guard # LLMEngine.on_device switched off
"""
import contextlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch  # noqa: E402

from backend.engine import EngineArgs, LLMEngine  # noqa: E402
from backend.sampling import SamplingParams  # noqa: E402
from kernels.alrkvd_attention import kernel_options  # noqa: E402

QWEN3_MOE = dict(model_type="qwen3_moe", vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, intermediate_size=256, moe_intermediate_size=64, num_experts=8,
                 num_experts_per_tok=2, norm_topk_prob=True, rms_norm_eps=1e-6, rope_theta=1e6,
                 max_position_embeddings=1024, tie_word_embeddings=False)

if "--no-guard" in sys.argv:
    LLMEngine.on_device = lambda self: contextlib.nullcontext()


def tokens(model_dir, device, kv_format, eager):
    options = kernel_options(64, block_size=32) if kv_format == "alrkvd" else {}
    engine = LLMEngine(EngineArgs(model=model_dir, load_format="dummy", tokenizer="none", device=device,
                                  dtype="float16", kv_format=kv_format, kv_options=options, max_num_seqs=4,
                                  enforce_eager=eager))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (27, 61, 40)]
    rids = [engine.add_request(None, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True), prompt_ids=p)
            for p in prompts]
    done = {}
    while engine.has_unfinished():
        done |= {o.request_id: o.token_ids for o in engine.step() if o.finished}
    torch.cuda.synchronize(device)
    graphs = engine.graphs is not None and any(v is not None for v in engine.graphs.graphs.values())
    del engine
    return [done[r] for r in rids], graphs


with tempfile.TemporaryDirectory() as d:
    (Path(d) / "config.json").write_text(json.dumps(QWEN3_MOE))
    results = []
    for kv_format in ("fp16", "alrkvd", "kivi4"):
        ref, _ = tokens(d, "cuda:0", kv_format, eager=True)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated(0)
        for eager in (True, False):
            torch.cuda.reset_peak_memory_stats(0)
            try:
                got, graphs = tokens(d, "cuda:1", kv_format, eager)
                row = dict(kv_format=kv_format, device="cuda:1", eager=eager, graphs_captured=graphs,
                           equal_to_cuda0=got == ref, gpu0_bytes_allocated_during=torch.cuda.max_memory_allocated(0) - before)
            except Exception as e:  # noqa: BLE001 - report
                row = dict(kv_format=kv_format, device="cuda:1", eager=eager, error=f"{type(e).__name__}: {str(e)[:300]}")
            print(json.dumps(row), flush=True)
            results.append(row)
    print(json.dumps(dict(guard="--no-guard" not in sys.argv, torch=torch.__version__,
                          devices=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                          ok=all(r.get("equal_to_cuda0") and r.get("gpu0_bytes_allocated_during") == 0 for r in results))))
