"""Engine decode speed.

CPU (`--cpu`): SmolLM2 greedy decode tokens/s at batch 1 against transformers `generate` in the
same run, and aggregate tokens/s of 8 concurrent streams; our engine with float32 weights and
with fp16 weights (`weight_dtype="float16"`, FBGEMM's fp16 GEMM).

GPU (`--gpu`): dummy weights of Qwen3-30B-A3B- and Mixtral-8x7B-shaped configs, decode step
time at batch 1/8/32 and context 4k/32k, next to the memory roofline: the bytes one step must
read (weights of attention, routers, norms, the experts the batch actually routes to, lm_head,
and the KV cache) divided by the device-to-device copy bandwidth measured in the same run.

    python benchmarks/bench_engine.py --cpu --max-tokens 128 --out cpu.json
    python benchmarks/bench_engine.py --gpu --out gpu.json
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from backend.config import ModelConfig  # noqa: E402
from backend.engine import EngineArgs, LLMEngine  # noqa: E402
from backend.kv_cache import SeqKV  # noqa: E402
from backend.kv_presets import PRESETS  # noqa: E402
from backend.model import MoE, Transformer  # noqa: E402
from backend.sampling import SamplingParams  # noqa: E402
from benchmarks.devices import copy_bandwidth  # noqa: E402
from kernels.alrkvd_attention import kernel_options  # noqa: E402
from server.dummy_repository import SHAPES, routed_expert_bytes  # noqa: E402  (the full-size MoE configs)


# ---- CPU ------------------------------------------------------------------------------------
def bench_cpu(max_tokens: int, rounds: int = 3) -> dict:
    """Tokens/s of our engine (float32 weights, and fp16 weights through FBGEMM), batch 1 and 8
    concurrent streams, and of transformers `generate` (float32 and bfloat16). All four systems are
    loaded first and measured in turns, `rounds` times; medians are reported (this shared VM's
    speed drifts by 20% over minutes, and turns expose every system to the same drift)."""
    import statistics

    import transformers

    from backend.tokenizer import Tokenizer, default_model_path
    prompt = "Write a short story about a lighthouse keeper who finds a message in a bottle."
    prompts = [f"{prompt} Variation {i}." for i in range(8)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    path = default_model_path()
    ids = torch.tensor([Tokenizer.load("default").encode(prompt)])

    def tok_s(fn, tokens):
        t0 = time.perf_counter()
        fn()
        return tokens / (time.perf_counter() - t0)

    runs = {}  # name -> (function, tokens it generates)
    for weights, name in (("auto", "ours"), ("float16", "ours_fp16_weights")):
        engine = LLMEngine(EngineArgs(kv_format="fp16", max_num_seqs=8, weight_dtype=weights))
        engine.generate([prompt], SamplingParams(max_tokens=4, temperature=0))  # warm-up
        runs[name] = (lambda e=engine: e.generate([prompt], params), max_tokens)
        runs[f"{name}_8_streams"] = (lambda e=engine: e.generate(prompts, params), 8 * max_tokens)
    for dtype, name in ((torch.float32, "transformers"), (torch.bfloat16, "transformers_bf16")):
        hf = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                               dtype=dtype).eval()
        with torch.inference_mode():
            hf.generate(ids, max_new_tokens=4, do_sample=False)
        runs[name] = (lambda m=hf: m.generate(ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                              do_sample=False), max_tokens)
    samples = {name: [] for name in runs}
    with torch.inference_mode():
        for _ in range(rounds):
            for name, (fn, tokens) in runs.items():
                samples[name].append(tok_s(fn, tokens))
    result = {"threads": torch.get_num_threads(), "max_tokens": max_tokens, "rounds": rounds, "samples": samples}
    result |= {f"{name}_tok_s": statistics.median(v) for name, v in samples.items()}
    for ours in ("ours", "ours_fp16_weights"):
        result[f"{ours}_aggregate_over_single"] = result[f"{ours}_8_streams_tok_s"] / result[f"{ours}_tok_s"]
        for ref in ("transformers", "transformers_bf16"):
            result[f"{ours}_over_{ref}"] = result[f"{ours}_tok_s"] / result[f"{ref}_tok_s"]
    return result


def cpu_logit_drift() -> dict:
    """How far logits move from transformers' float32 ones (the reference) on one text: our engine
    with fp16 weights, and transformers in bfloat16 (its fastest setting on this CPU)."""
    import transformers

    from backend.tokenizer import default_model_path
    path = default_model_path()
    text = ("The capital of France is In 1905, Albert Einstein published four papers that def fibonacci(n): "
            "Once upon a time, in a small village by the sea, there lived an old fisherman who ") * 3
    engine = LLMEngine(EngineArgs(kv_format="full", max_num_seqs=1, weight_dtype="float16"))
    ids = engine.tokenizer.encode(text)
    logits = {"ours_fp16_weights": engine.score(ids, chunk_size=128)}
    for dtype, name in ((torch.float32, "reference"), (torch.bfloat16, "transformers_bf16")):
        hf = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                               dtype=dtype).eval()
        with torch.inference_mode():
            logits[name] = hf(torch.tensor([ids])).logits[0].float()
    ref = logits.pop("reference")
    return {"tokens": len(ids), "max_abs_reference_logit": ref.abs().max().item(),
            **{name: {"max_abs_diff": (x - ref).abs().max().item(), "mean_abs_diff": (x - ref).abs().mean().item(),
                      "argmax_agreement": (x.argmax(-1) == ref.argmax(-1)).float().mean().item()}
               for name, x in logits.items()}}


# ---- GPU ------------------------------------------------------------------------------------
def kernel_format(name: str, head_dim: int) -> tuple[str, dict]:
    """A format name of these benchmarks -> (kv_format, kv_options): `alrkvd` with the options its Triton kernels
    read (`kernel_options`), `alrkvd-<frame>` the same with key_frame=<frame> (post_rope, rotated); presets
    (backend/kv_presets.py) and other formats as they are. `NAME@key=value+key=value` overrides options
    (`alrkvd-gpu@block_size=128`: the served preset in blocks of 128; `+`, since arm lists split on commas)."""
    name, _, overrides = name.partition("@")
    options = {k: int(v) if v.isdigit() else v for k, v in (kv.split("=", 1) for kv in overrides.split("+") if kv)}
    kv_format, _, key_frame = name.partition("-")
    if kv_format != "alrkvd" or name in PRESETS:  # a preset (alrkvd-gpu: the served one) as the engine resolves it
        return name, options
    return kv_format, {**kernel_options(head_dim, **({"key_frame": key_frame} if key_frame else {})), **options}


def kernel_tokens(kv_format: str = "alrkvd", steps: int = 60) -> list[dict]:
    """Greedy tokens of a compressed format's decode kernel (alrkvd, kivi2, kivi4) against the PyTorch path,
    float32 on CUDA, dummy SmolLM2-shaped weights (4 layers), three prompts whose decodes cross block borders;
    and decode steps replayed as CUDA graphs (backend/cuda_graphs.py) against eager ones."""
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(dict(model_type="llama", vocab_size=4096, hidden_size=576, intermediate_size=1536,
                       num_hidden_layers=4, num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5,
                       rope_theta=10000.0, max_position_embeddings=4096, tie_word_embeddings=True), f)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 4096, (n,), generator=g).tolist() for n in (300, 250, 90)]
    tokens = {}
    label = kv_format
    kv_format, options = kernel_format(kv_format, 64)
    for backend, eager in (("auto", False), ("auto-eager", True), ("torch", True)):
        engine = LLMEngine(EngineArgs(model=folder, load_format="dummy", tokenizer="none", device="cuda",
                                      dtype="float32", kv_format=kv_format, kv_options=options,
                                      attention_backend=backend.split("-")[0], max_num_seqs=4, enforce_eager=eager))
        assert (engine.cache.decode_kernel is not None) == (backend != "torch"), f"{kv_format}: no decode kernel"
        assert (engine.graphs is not None) == (not eager)
        params = SamplingParams(max_tokens=steps, temperature=0, ignore_eos=True)
        rids = [engine.add_request(None, SamplingParams(**vars(params)), prompt_ids=p) for p in prompts]
        done = {}
        while engine.has_unfinished():
            done |= {o.request_id: o.token_ids for o in engine.step() if o.finished}
        tokens[backend] = [done[r] for r in rids]
    rows = []
    for n, a, eager, b in zip((300, 250, 90), tokens["auto"], tokens["auto-eager"], tokens["torch"]):
        rows.append({"kv_format": label, "prompt_tokens": n, "steps": steps, "equal": a == b,
                     "first_difference": next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None),
                     "graphs_equal_eager": a == eager})
    return rows


class ExpertCounter:
    """Counts the distinct experts the MoE layers run in a step (what the step must read).
    Enabled only for an untimed step: it routes a second time."""

    def __init__(self, model):
        self.unique, self.enabled = 0, False
        for m in model.modules():
            if isinstance(m, MoE):
                m.register_forward_hook(self.hook)

    def hook(self, module, inputs, output):
        if self.enabled:
            _, ids = module.route(inputs[0])
            self.unique += ids.unique().numel()


def step_bytes(engine: LLMEngine, unique_experts: int, batch: int, context: int) -> int:
    cfg, model = engine.cfg, engine.model
    elt = model.embed_tokens.weight.element_size()
    expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size * elt
    non_expert = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                     if n.split(".")[-1] not in ("w13", "w2") and "embed_tokens" not in n)
    kv = batch * context * engine.cache.block_bytes / engine.cache.block_size  # the format's own bytes
    return non_expert + unique_experts * expert + batch * cfg.hidden_size * elt + kv


def weight_bytes(cfg: dict, elt: int = 2) -> int:
    with torch.device("meta"):
        model = Transformer(ModelConfig.from_hf(cfg))
    return sum(p.numel() for p in model.parameters()) * elt


# engine options from the command line: --routing (seeded: every arm runs the same experts, Transformer.seed_routing)
# and the expert cache's
ROUTING = {"moe_routing": "seeded"}
MAX_MODEL_LEN = {"max_model_len": 40960}  # --max-model-len: longer rotary tables for the dummy shapes


def dummy_engine(name: str, kv_format: str, **args) -> LLMEngine:
    """The engine on CUDA over dummy weights of SHAPES[name] (chunks of 8192 tokens, 40960 positions or
    `--max-model-len`);
    `alrkvd` with the options its Triton kernels read; `alrkvd-post_rope` the same with key_frame=post_rope.
    Routing as `--routing` says (seeded by default)."""
    shape = SHAPES[name]
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(shape, f)
    head_dim = shape.get("head_dim") or shape["hidden_size"] // shape["num_attention_heads"]
    kv_format, kv_options = kernel_format(kv_format, head_dim)
    return LLMEngine(EngineArgs(model=folder, load_format="dummy", tokenizer="none", device="cuda",
                                kv_format=kv_format, kv_options=kv_options,
                                **{"max_num_batched_tokens": 8192, **MAX_MODEL_LEN, **ROUTING, **args}))


def rows_one_by_one(engine: LLMEngine) -> LLMEngine:
    """The ALR-KVD decode kernel reading a prompt chunk's rows one by one in mixed graph steps, as before it read
    them in tiles (a same-run baseline): the graphs' buffers stay, no step gets tiles."""
    engine.cache.kernels = engine.cache.kernels._replace(tile_rows=None)
    return engine


def bench_gpu(shapes, batches, contexts, steps: int, expert_fractions=(1.0,), kv_formats=("fp16",),
              modes=("graphs",)) -> list[dict]:
    """`expert_fractions` below 1: the routed experts stream from pinned host memory through a
    device cache of that fraction of their bytes (backend/experts.py), the whole model in the engine.
    `kv_formats`: the paged cache's format (fp16: the Triton paged kernel; others: their decode path);
    `alrkvd` (`alrkvd-rotated`, `alrkvd-gpu`) gives two rows from one engine: the blocks a decode step fills
    compressed when the step's forward is queued (CUDA graphs where decode steps replay them), and the same
    eagerly.
    `modes`: decode steps replayed as CUDA graphs (`graphs`, the engine's default where it can), the same with each
    step queued before the last one's tokens are read (`async`, `async_scheduling`), or launched from Python
    (`eager`), in the same engine."""
    rows = []
    bw = copy_bandwidth()
    for name, fraction, kv_format in [(n, f, k) for n in shapes for f in expert_fractions for k in kv_formats]:
        weights = weight_bytes(SHAPES[name])
        experts = routed_expert_bytes(SHAPES[name])
        expert_budget = None if fraction >= 1 else int(fraction * experts)
        on_device = weights if expert_budget is None else weights - experts + expert_budget
        budget = torch.cuda.mem_get_info()[0] - on_device - (6 << 30)  # headroom for activations
        engine = dummy_engine(name, kv_format, kv_budget_bytes=budget, max_num_seqs=64,
                              expert_budget_bytes=expert_budget)
        counter = ExpertCounter(engine.model)
        # a prompt that fills a block: compiles what compressing one needs before anything is timed
        engine.add_request(None, SamplingParams(max_tokens=2, ignore_eos=True), prompt_ids=[1] * (engine.cache.block_size + 8))
        while engine.has_unfinished():
            engine.step()
        graphs = engine.graphs
        compression = graphs.compression if graphs is not None else None
        if compression is not None:
            compression.capture_all()  # as the server does at start-up
        # ALR-KVD in the same engine: the blocks decode steps fill compressed through CUDA graphs where the step is
        # one (`CompressGraphs`), then eagerly (the code before 2026-12-06)
        variants = [(kv_format, compression)]
        if compression is not None:
            variants.append((f"{kv_format}, compression eager", engine.cache.kernels.compress))
        for batch in batches:
            for context in contexts:
                for (label, compress), mode in [(v, m) for v in variants for m in modes]:
                    if compress is not None:
                        engine.cache.compress_blocks = compress
                    engine.graphs = graphs if mode in ("graphs", "async") else None
                    engine.args.async_scheduling = mode == "async"
                    row = {"model": name, "batch": batch, "context": context, "weights_gb": weights / 1e9,
                           "expert_fraction": fraction, "kv_format": label,
                           "mode": mode if mode == "eager" or graphs is not None else "eager (no graphs)",
                           "free_gb_before": torch.cuda.mem_get_info()[0] / 1e9}
                    try:
                        row.update(run_decode(engine, counter, batch, context, steps, bw))
                    except (torch.OutOfMemoryError, MemoryError, ValueError) as e:
                        row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
                        for rid in list(engine.requests):
                            engine.abort(rid)
                        torch.cuda.empty_cache()
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        del engine, counter, graphs
        gc.collect()  # the engine's reference cycles: free its memory before the next one sizes its budget
        torch.cuda.empty_cache()
    for r in rows:
        r["copy_bw_gb_s"] = bw / 1e9
    return rows


def run_decode(engine: LLMEngine, counter: ExpertCounter, batch: int, context: int, steps: int, bw: float) -> dict:
    """Decode steps of `batch` sequences that hold about `context` cached tokens (synthetic KV): the timed
    step `steps // 2` writes position context - 1, so with a context that is a multiple of the block size
    every sequence fills a block in that step (`fill_step_ms`; `step_ms` is the median of all steps)."""
    cache = engine.cache
    params = SamplingParams(max_tokens=steps + 4, temperature=0, ignore_eos=True)
    rids = []
    start = context - 4 - steps // 2  # cached before the 3 warm-up steps
    for i in range(batch):
        rid = engine.add_request(None, SamplingParams(**vars(params)), prompt_ids=[1] * (start + 1))
        seq = engine.requests[rid]
        cache.allocate(seq.kv, start)   # the prompt's KV "already computed": skip the prefill
        seq.kv.num_tokens = start
        rids.append(rid)
    engine.waiting, engine.running = [], [engine.requests[r] for r in rids]
    sync = torch.cuda.synchronize if engine.args.device.startswith("cuda") else (lambda: None)
    queued = engine.args.async_scheduling  # then a step returns the last one's tokens, the next one queued:
    step_sync = (lambda: None) if queued else sync  # its wall is the time between steps, not one step's alone
    warmup = []  # the first includes capturing this batch size's graph, when graphs are on and it is new
    for _ in range(3):
        t0 = time.perf_counter()
        engine.step()
        sync()
        warmup.append(time.perf_counter() - t0)
    expert_cache = getattr(engine.model, "expert_cache", None)
    if expert_cache is not None:
        expert_cache.reset_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        step_sync()
        times.append(time.perf_counter() - t0)
    if queued:  # the queued step's tokens, nothing queued behind it
        engine.args.async_scheduling = False
        engine.step()
        engine.args.async_scheduling = True
    streaming = {}
    if expert_cache is not None:
        st = expert_cache.stats()
        streaming = {k: st.get(f"expert_{k}") for k in ("hit_rate", "bytes_per_token", "stall_s_per_token",
                                                         "copy_gbps", "prefetch_recall", "decisions")}
    counter.unique, counter.enabled = 0, True
    graphs, engine.graphs = engine.graphs, None  # the counting hook runs only in an eager step
    engine.step()
    engine.graphs, counter.enabled = graphs, False
    unique = counter.unique
    for r in rids:
        engine.abort(r)
    step_s = sorted(times)[len(times) // 2]
    nbytes = step_bytes(engine, unique, batch, context)
    return {"step_ms": step_s * 1e3, "fill_step_ms": times[steps // 2] * 1e3, "tok_s": batch / step_s,
            "first_step_ms": warmup[0] * 1e3,
            "bytes_per_step_gb": nbytes / 1e9,
            "roofline_ms": nbytes / bw * 1e3, "gap": step_s / (nbytes / bw),
            "unique_experts_per_step": unique, **streaming}


def bench_gpu_mixed(name: str, batches, contexts, step_tokens: int, steps: int, kv_format: str = "fp16",
                    piecewise: bool = True) -> list[dict]:
    """Steps that carry prompt chunks beside running decodes (dummy weights): `batch` sequences decode at
    about `context` cached tokens while others bring `step_tokens - batch` prompt tokens after their own
    `context` cached ones (synthetic KV: long prompts' middle chunks): one chunk, or for windowed formats
    without `piecewise` chunks of a block each. In turns, in one engine: a decode-only step (graph), the mixed
    step through the graph runner (the tiles kernel in one graph; windowed formats: every row read by the decode
    kernel in one graph, or with `piecewise` graph pieces and the attention eager between them) and eagerly (the
    PyTorch path, prompt chunks sequence by sequence); medians of `steps` turns."""
    kv_format, _, arm = kv_format.partition(":")  # "alrkvd-gpu:rows": a chunk's rows one by one
    engine = dummy_engine(name, kv_format, kv_budget_bytes=8 << 30, max_num_seqs=64,  # (fits an H100)
                          cuda_graph_max_tokens=step_tokens, piecewise_graphs=piecewise)
    if arm == "rows":
        rows_one_by_one(engine)
    graphs = engine.graphs
    cache = engine.cache
    rows = []

    def synthetic(prompt_len: int, cached: int, max_tokens: int) -> str:
        rid = engine.add_request(None, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
                                 prompt_ids=[1] * prompt_len)
        seq = engine.requests[rid]
        cache.allocate(seq.kv, cached)  # the KV "already computed": skip the prefill
        seq.kv.num_tokens = cached
        engine.waiting.remove(seq)
        engine.running.append(seq)
        return rid

    def timed_step() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    for batch in batches:
        for context in contexts:
            chunk = step_tokens - batch
            # after `context` cached tokens, a multiple of the block size; windowed formats' chunk in one run of
            # window slots, or in graph pieces, or in chunks of a block each
            parts = [chunk] if graphs.piecewise or cache.window_runs else cache.new_prompt_chunks(chunk)
            seqs = batch + len(parts)
            need = cache.blocks_needed(SeqKV(), seqs * (context + cache.block_size + chunk)) + seqs
            if need > cache.allocator.num_free:
                print(json.dumps({"batch": batch, "context": context, "skipped": "the KV cache is too small"}))
                continue
            rids = [synthetic(context, context - 1, 3 * steps + 12) for _ in range(batch)]
            ms = {"decode": [], "mixed_graph": [], "mixed_eager": []}
            for turn in range(steps + 2):  # two warm-up turns (the first captures this size's graphs)
                for mode in ms:
                    engine.graphs = None if mode == "mixed_eager" else graphs
                    newcomers = [synthetic(context + n, context, 1) for n in parts] if mode != "decode" else []
                    t = timed_step()
                    assert sorted(n for _, n in engine.plan) == sorted([1] * batch + (parts if newcomers else []))
                    for r in newcomers:
                        engine.abort(r)
                    if turn >= 2:
                        ms[mode].append(t)
            engine.graphs = graphs
            for r in rids:
                engine.abort(r)
            row = {"model": name, "kv_format": kv_format + (":rows" if arm == "rows" else ""), "batch": batch,
                   "context": context, "chunk": chunk, **{f"{m}_ms": statistics.median(v) for m, v in ms.items()},
                   "all_ms": ms}
            row["graph_speedup"] = row["mixed_eager_ms"] / row["mixed_graph_ms"]
            row["mixed_over_decode"] = row["mixed_graph_ms"] / row["decode_ms"]
            print(json.dumps({k: v for k, v in row.items() if k != "all_ms"}), flush=True)
            rows.append(row)
    return rows


def bench_gpu_prefill(name: str, contexts, kv_formats) -> list[dict]:
    """Time to first token of one prompt of each length through the engine (chunked prefill of 8192
    tokens: attention, MoE, and for `alrkvd` the compression of every full block), per KV format."""
    rows = []
    for kv_format in kv_formats:
        engine = dummy_engine(name, kv_format, kv_budget_bytes=8 << 30, max_num_seqs=4)
        params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
        spent = {"compress_s": 0.0, "compress_calls": 0, "compressed_blocks": 0}
        compress = engine.cache.compress

        def timed_compress(blocks):  # the share of block compression in the prefill (synchronised)
            torch.cuda.synchronize()
            t = time.perf_counter()
            compress(blocks)
            torch.cuda.synchronize()
            spent["compress_s"] += time.perf_counter() - t
            spent["compress_calls"] += 1
            spent["compressed_blocks"] += len(blocks)  # (block, layer) pairs
        engine.cache.compress = timed_compress
        # the first run warms up at the longest prompt: chunks over a history compile kernels that
        # a one-chunk prompt never launches
        for context in [max(contexts)] + list(contexts):
            spent.update(compress_s=0.0, compress_calls=0, compressed_blocks=0)
            rid = engine.add_request(None, SamplingParams(**vars(params)), prompt_ids=[1] * context)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            while engine.has_unfinished():
                engine.step()
            torch.cuda.synchronize()
            row = {"model": name, "kv_format": kv_format, "context": context, "ttft_s": time.perf_counter() - t0,
                   **spent}
            engine.requests.pop(rid, None)
            print(json.dumps(row), flush=True)
            rows.append(row)
        rows.pop(-len(contexts) - 1)  # the warm-up
        del engine
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--cpu-logits", action="store_true", help="logit drift of fp16 weights and of transformers bf16")
    ap.add_argument("--gpu-alrkvd-tokens", action="store_true", help="ALR-KVD kernel vs PyTorch path, greedy tokens")
    ap.add_argument("--tokens-formats", default="alrkvd", help="formats of --gpu-alrkvd-tokens, e.g. alrkvd,kivi4")
    ap.add_argument("--modes", default="graphs",
                    help="--gpu: graphs,async,eager compares CUDA-graph decode steps, the same queued ahead "
                         "(async_scheduling) and eager ones")
    ap.add_argument("--gpu-prefill", action="store_true", help="time to first token of long prompts per KV format")
    ap.add_argument("--gpu-mixed", type=int, metavar="TOKENS",
                    help="steps of TOKENS tokens, a prompt chunk beside the decodes: CUDA graph against eager")
    ap.add_argument("--mixed-graphs", default="pieces", choices=["pieces", "whole"],
                    help="--gpu-mixed, ALR-KVD and KIVI: a chunk across blocks in graph pieces (piecewise_graphs), "
                         "or chunks of a block each in one graph (the engine's default)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="CPU: turns over the four systems (medians reported)")
    ap.add_argument("--models", default="qwen3-30b-a3b,mixtral-8x7b")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--contexts", default="4096,32768")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--kv-formats", default="fp16", help="e.g. fp16,alrkvd: paged KV formats compared")
    ap.add_argument("--expert-fractions", default="1.0", help="e.g. 1.0,0.5: expert cache sizes (streaming below 1)")
    ap.add_argument("--routing", default="seeded", choices=["seeded", "local", "learned"],
                    help="MoE routing of the dummy models: seeded (the same experts in every arm), local (the same, "
                         "with a trained router's load skew and reuse: expert-cache benchmarks) or learned")
    ap.add_argument("--expert-prefetch", type=int, default=1, help="streamed experts: MoE layers predicted ahead")
    ap.add_argument("--expert-policy", default="lru", choices=["lru", "lfu"])
    ap.add_argument("--max-model-len", type=int, default=40960, help="positions (contexts past the shapes' 40,960)")
    ap.add_argument("--out")
    args = ap.parse_args()
    MAX_MODEL_LEN.update(max_model_len=args.max_model_len)
    ROUTING.update(moe_routing=args.routing, expert_prefetch=args.expert_prefetch, expert_policy=args.expert_policy)
    result = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "moe_routing": args.routing}
    if args.cpu:
        result["cpu"] = bench_cpu(args.max_tokens, args.rounds)
        print(json.dumps(result["cpu"], indent=1))
    if args.cpu_logits:
        result["cpu_logits"] = cpu_logit_drift()
        print(json.dumps(result["cpu_logits"], indent=1))
    if args.gpu_alrkvd_tokens:
        result["alrkvd_kernel_tokens"] = [row for f in args.tokens_formats.split(",") for row in kernel_tokens(f)]
        print(json.dumps(result["alrkvd_kernel_tokens"], indent=1))
    if args.gpu_prefill:
        result["device"] = torch.cuda.get_device_name()
        result["gpu_prefill"] = bench_gpu_prefill(args.models.split(",")[0], [int(c) for c in args.contexts.split(",")],
                                                  args.kv_formats.split(","))
    if args.gpu_mixed:
        result["device"] = torch.cuda.get_device_name()
        result["gpu_mixed"] = []
        for kv_format in args.kv_formats.split(","):  # one engine per format, one after the other
            result["gpu_mixed"] += bench_gpu_mixed(args.models.split(",")[0], [int(b) for b in args.batches.split(",")],
                                                   [int(c) for c in args.contexts.split(",")], args.gpu_mixed,
                                                   args.steps, kv_format, args.mixed_graphs == "pieces")
            gc.collect()
            torch.cuda.empty_cache()
    if args.gpu:
        result["device"] = torch.cuda.get_device_name()
        result["gpu"] = bench_gpu(args.models.split(","), [int(b) for b in args.batches.split(",")],
                                  [int(c) for c in args.contexts.split(",")], args.steps,
                                  [float(f) for f in args.expert_fractions.split(",")], args.kv_formats.split(","),
                                  args.modes.split(","))
        print(f"{'model':15} {'kv':>18} {'mode':>6} {'experts':>7} {'B':>3} {'ctx':>6} {'step ms':>9} {'fill ms':>8} "
              f"{'roofline ms':>11} {'gap':>6}")
        for r in result["gpu"]:
            head = (f"{r['model']:15} {r['kv_format']:>18} {r['mode'][:6]:>6} {r['expert_fraction']:7.0%} "
                    f"{r['batch']:>3} {r['context']:>6}")
            if "error" in r:
                print(f"{head}  {r['error']}")
            else:
                print(f"{head} {r['step_ms']:9.2f} {r['fill_step_ms']:8.2f} {r['roofline_ms']:11.2f} {r['gap']:6.2f} "
                      + (f"hit {r['hit_rate']:.2f} recall {r['prefetch_recall']:.2f} "
                         f"{r['bytes_per_token'] / 1e6:.0f} MB/token, decided on the {r['decisions'] or 'host'}"
                         if "hit_rate" in r else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
