"""Steps as CUDA graphs (backend/cuda_graphs.py) give the tokens of eager steps: decode steps for every
format with a decode kernel, while the batch shrinks and decodes fill blocks; steps that carry prompt chunks
beside decodes (fp16), padded to the graph's size. On CUDA the graphs are
captured and replayed; on CPU the kernels' PyTorch references stand in for the kernels and the graph
runner drives the same static buffers without capturing (everything but the capture itself)."""
from kernels.testing import use_interpreter_without_gpu

DEVICE = use_interpreter_without_gpu()

import json  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from backend import cuda_graphs  # noqa: E402
from backend import model as model_module  # noqa: E402
from backend.cuda_graphs import CompressGraphs, StepGraphs  # noqa: E402
from backend.engine import EngineArgs, LLMEngine  # noqa: E402
from backend.kv_cache import SeqKV  # noqa: E402
from backend.engine import LOCALITY  # noqa: E402
from backend.model import MoE, local_routes  # noqa: E402
from backend.sampling import SamplingParams  # noqa: E402
from backend.step_cost import StepCost  # noqa: E402
from kernels.alrkvd_attention import alrkvd_decode_attention_ref, kernel_options, tile_rows  # noqa: E402
from kernels.kivi_attention import kivi_decode_attention_ref  # noqa: E402
from kernels.paged_attention import paged_decode_attention_ref  # noqa: E402

LLAMA = dict(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
             max_position_embeddings=1024, tie_word_embeddings=True)
QWEN3_MOE = dict(model_type="qwen3_moe", vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, intermediate_size=256, moe_intermediate_size=64, num_experts=8,
                 num_experts_per_tok=2, norm_topk_prob=True, rms_norm_eps=1e-6, rope_theta=1e6,
                 max_position_embeddings=1024, tie_word_embeddings=False)
TILED = {"rows": 0, "apart": 0, "rows_apart": 0}  # rows the ALR-KVD reference took in tiles, or apart beside them


def alrkvd_rows_ref(q, cache, window_k, window_v, tables, seq_lens, window_slots, cos, sin, scale, closed=None,
                    tile_starts=None, tile_counts=None, **kwargs):
    """`alrkvd_decode_attention`'s contract, row by row, after checking what it asks of the tiles of a step's rows:
    each row in one tile (but the first TILED["apart"], `PagedKVCache.rows_apart`), a tile's rows consecutive rows of
    one sequence (the same table, window slot and closed blocks as its first row, lengths that never fall), at most
    `tile_rows` of them."""
    if tile_starts is None and closed is not None:  # a prompt step's rows one by one
        TILED["rows_apart"] += q.shape[0]
    if tile_starts is not None:
        covered = []
        for start, n in zip(tile_starts.tolist(), tile_counts.tolist()):
            assert n <= tile_rows(cache, q.shape[1], q.device)
            rows = list(range(start, start + n))
            covered += rows
            for r in rows[1:]:
                assert torch.equal(tables[r], tables[start]) and window_slots[r] == window_slots[start]
                assert seq_lens[r] >= seq_lens[r - 1] and (closed is None or closed[r] == closed[start])
        assert sorted(covered) == list(range(TILED["apart"], q.shape[0]))
        TILED["rows"] += q.shape[0]
    out = alrkvd_decode_attention_ref(q, cache, window_k, window_v, tables, seq_lens, window_slots, cos, sin, scale,
                                      closed=closed, **kwargs)
    if tile_starts is not None:
        out[:TILED["apart"]] = float("nan")  # as the kernel, nothing for rows outside the tiles
    return out


REFERENCES = {"fp16": paged_decode_attention_ref, "alrkvd": alrkvd_rows_ref,
              "kivi4": kivi_decode_attention_ref}


def tiles_ref(q, k_cache, v_cache, tables, seq_lens, tile_starts, tile_counts, scale):
    """`paged_tiles_attention`'s contract: each row as a decode row (tests/kernels checks the kernel against it)."""
    return paged_decode_attention_ref(q, k_cache, v_cache, tables, seq_lens, scale)


def engine_for(tmp_path, shape: dict, kv_format: str, **args) -> LLMEngine:
    (tmp_path / "config.json").write_text(json.dumps(shape))
    options = kernel_options(64, block_size=32) if kv_format == "alrkvd" else {}
    engine = LLMEngine(EngineArgs(model=str(tmp_path), load_format="dummy", tokenizer="none", device=DEVICE,
                                  dtype="float32", kv_format=kv_format, kv_options=options,
                                  **{"max_num_seqs": 4, "enforce_eager": True, **args}))
    if DEVICE == "cpu":
        engine.cache.decode_kernel = REFERENCES[kv_format]
        if kv_format == "fp16":
            engine.cache.tiles_kernel = tiles_ref
    build = engine.cache.build_decode_meta

    def build_and_note(*args, **kwargs):  # the rows the step reads apart: the reference checks the tiles after them
        meta = build(*args, **kwargs)
        TILED["apart"] = meta.get("rows_apart", 0)
        return meta
    engine.cache.build_decode_meta = build_and_note
    assert engine.graphs is None and engine.cache.decode_kernel is not None
    return engine


@pytest.mark.parametrize("shape", [LLAMA, QWEN3_MOE], ids=["llama", "qwen3_moe"])
@pytest.mark.parametrize("kv_format", ["fp16", "alrkvd", "kivi4"])
def test_graphs_give_the_eager_tokens(tmp_path, shape, kv_format):
    engine = engine_for(tmp_path, shape, kv_format)
    block = engine.cache.block_size
    g = torch.Generator().manual_seed(0)
    # three sequences that finish at different steps (batch sizes 3, 2, 1), decodes that fill blocks
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (block - 5, 2 * block - 3, 40)]
    steps = [block + 8, 12, 20]

    def generate():
        rids = [engine.add_request(None, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True), prompt_ids=p)
                for p, n in zip(prompts, steps)]
        done = {}
        while engine.has_unfinished():
            done |= {o.request_id: o.token_ids for o in engine.step() if o.finished}
        return [done[r] for r in rids]

    engine.reset_routing_counts()
    expected = generate()
    eager_counts = engine.routing_counts()  # tokens routed to each expert (MoE; None for llama)
    engine.graphs = StepGraphs(engine.model, engine.cache, 4, engine.max_model_len, capture=DEVICE == "cuda")
    assert generate() == expected
    assert sorted(engine.graphs.graphs) == [("decode", b) for b in (1, 2, 3)]  # captured on first use
    assert all((g is not None) == (DEVICE == "cuda") for g in engine.graphs.graphs.values())
    # captured up front (the server's start-up), with throwaway sequences that leave nothing behind
    engine.graphs = StepGraphs(engine.model, engine.cache, 4, engine.max_model_len, capture=DEVICE == "cuda")
    engine.graphs.capture_all()
    assert sorted(engine.graphs.graphs) == [("decode", b) for b in (1, 2, 3, 4)]
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks
    engine.reset_routing_counts()
    assert generate() == expected
    if eager_counts is not None:  # graph replays count routed tokens (alrkvd:moe_expert_load_imbalance) as eager steps do
        assert eager_counts.sum() > 0 and torch.equal(engine.routing_counts(), eager_counts)
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks
    # `async_scheduling`: each decode step replayed with the tokens the last one drew, before the host read them
    engine.args.async_scheduling, queued = True, []
    step = engine.step
    engine.step = lambda: (queued.append(engine.pending is not None), step())[1]
    assert generate() == expected
    assert sum(queued) >= max(steps) - 4  # all but the prompts' step and those after a finish
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks


def test_capture_all_stops_at_what_the_cache_holds(tmp_path):
    """Start-up capture with fewer free blocks than `max_num_seqs`: the sizes that fit, and no error."""
    engine = engine_for(tmp_path, LLAMA, "fp16")
    held = engine.cache.allocator.allocate(engine.cache.allocator.num_free - 2)  # two blocks left
    graphs = StepGraphs(engine.model, engine.cache, 4, engine.max_model_len, capture=DEVICE == "cuda")
    graphs.capture_all()
    assert sorted(graphs.graphs) == [("decode", 1), ("decode", 2)]
    engine.cache.allocator.free(held)


@pytest.mark.parametrize("shape", [LLAMA, QWEN3_MOE], ids=["llama", "qwen3_moe"])
def test_mixed_steps_give_the_eager_tokens(tmp_path, shape):
    """Prompts that arrive while others decode: their chunks, cut to fit a graph beside the decodes, run in
    padded mixed-step graphs and give the eager engine's tokens and routed-token counts (padding not counted)."""
    engine = engine_for(tmp_path, shape, "fp16")
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (5, 70, 23, 41)]

    def generate():
        params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        rids, done, plans = [engine.add_request(None, params, prompt_ids=prompts[0])], {}, []
        for step in range(200):
            if step in (2, 3, 5):  # newcomers while the first decodes
                rids.append(engine.add_request(None, params, prompt_ids=prompts[len(rids)]))
            done |= {o.request_id: o.token_ids for o in engine.step() if o.finished}
            plans.append(sorted(n for _, n in engine.plan))
            if not engine.has_unfinished():
                return [done[r] for r in rids], plans

    engine.reset_routing_counts()
    expected, eager_plans = generate()
    eager_counts = engine.routing_counts()
    engine.graphs = StepGraphs(engine.model, engine.cache, 4, engine.max_model_len, max_tokens=32,
                               capture=DEVICE == "cuda")
    engine.graphs.capture_all()  # (a capture's warm-up run counts routed tokens: reset after it, as the server does)
    assert sorted(engine.graphs.graphs) == [("decode", b) for b in (1, 2, 3, 4)] + [("mixed", 16), ("mixed", 32)]
    engine.reset_routing_counts()
    tokens, plans = generate()
    assert tokens == expected
    mixed = [p for p in plans if len(p) > 1 and max(p) > 1]
    assert mixed and all(sum(p) <= 32 for p in mixed)  # prompt chunks beside decodes, cut to the graph's size
    assert any(sum(p) > 32 for p in eager_plans if len(p) > 1)  # eager, the same chunks are not cut
    if eager_counts is not None:
        assert torch.equal(engine.routing_counts(), eager_counts)
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks


def layered_engine(tmp_path, max_num_batched_tokens: int, kv_format: str = "fp16", groups: int = 2) -> LLMEngine:
    """An eager engine over a 4-layer dummy MoE with layered prefill in `groups` groups (16 experts, 2 a token:
    layering beside up to 5 decodes, `layering_max_decodes`)."""
    return engine_for(tmp_path, dict(QWEN3_MOE, num_hidden_layers=4, num_experts=16), kv_format,
                      layered_prefill=groups, max_num_batched_tokens=max_num_batched_tokens)


def graph_layered_steps(engine: LLMEngine, max_tokens: int = 16) -> list[tuple[int, int]]:
    """Give `engine` graphs (decodes of up to 2, mixed steps of up to `max_tokens` rows, layer groups up to its step
    budget), captured now. Returns the list that takes each layered step's (first layer, rows) from then on."""
    engine.graphs = StepGraphs(engine.model, engine.cache, 2, engine.max_model_len, max_tokens=max_tokens,
                               capture=DEVICE == "cuda", layer_groups=engine.layer_groups(),
                               layer_tokens=engine.args.max_num_batched_tokens)
    engine.graphs.capture_all()
    taken, run_layers = [], engine.graphs.run_layers
    engine.graphs.run_layers = lambda *args: taken.append((args[-2], len(args[2]))) or run_layers(*args)
    return taken


@pytest.mark.parametrize("kernels", [pytest.param(False, id="reference"), pytest.param(True, id="kernels")]
                         if DEVICE == "cpu" else [pytest.param(True, id="kernels")])
def test_layered_steps_give_the_eager_tokens(tmp_path, monkeypatch, kernels):
    """Layered prefill (4 layers in groups of 2) beside decodes: each step's group of layers replays a graph of its
    own over the prompt chunks' padded rows (their residual stream kept between steps in static buffers: hidden
    states, or on the kernel path a MoE's unreduced pairs), and the tokens, the steps' plans and the tokens routed
    a layer are the eager engine's."""
    monkeypatch.setattr(model_module, "KERNELS_ON_CPU", kernels and DEVICE == "cpu")
    engine = layered_engine(tmp_path, max_num_batched_tokens=32)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (5, 7, 9, 41)]
    engine.reset_routing_counts()
    expected, eager_plans = generate_with_arrivals(engine, prompts, 6, arrivals=(2, 4))
    eager_counts = engine.routing_counts()
    taken = graph_layered_steps(engine)
    assert sorted(k for k in engine.graphs.graphs if k[0] != "decode") == [
        ("layers", first, size) for first in (0, 2) for size in (16, 32)] + [("mixed", 16)]
    engine.reset_routing_counts()
    assert generate_with_arrivals(engine, prompts, 6, arrivals=(2, 4)) == (expected, eager_plans)
    assert sorted(set(taken)) == [(0, 9), (0, 32), (2, 9), (2, 32)]  # rows padded to 16, and a graph of 32
    # tokens routed a layer: the padding rows count none (which experts, a near tie may move: a GEMM's rounding
    # depends on its row count)
    assert torch.equal(engine.routing_counts().sum(1), eager_counts.sum(1))
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks


def test_layered_graphs_go_on_after_a_cancel(tmp_path):
    """Two prompts layered together, one cancelled after the first group of layers: the other's rows go on through
    the next group's graph alone (20 of the 32 rows), with the eager engine's tokens; every block comes back."""
    engine = layered_engine(tmp_path, max_num_batched_tokens=64)
    g = torch.Generator().manual_seed(3)
    chat, first, second = (torch.randint(0, 512, (n,), generator=g).tolist() for n in (20, 12, 20))

    def run():
        params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        engine.add_request(None, params, request_id="chat", prompt_ids=chat)
        out = {}
        for step in range(12):
            if step == 2:
                engine.add_request(None, params, request_id="first", prompt_ids=first)
                engine.add_request(None, params, request_id="second", prompt_ids=second)
            if step == 3:
                engine.abort("first")
            out.update((o.request_id, o.token_ids) for o in engine.step())
        assert not engine.has_unfinished()
        assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks
        return out

    expected = run()
    taken = graph_layered_steps(engine)
    assert run() == expected
    assert taken == [(0, 32), (2, 20)]


@pytest.mark.parametrize("kv_format", ["fp16", "alrkvd"])
def test_layered_graphs_finish_the_layers_in_one_step_when_the_decodes_end(tmp_path, kv_format):
    """A prompt layered in four groups beside a chat that ends after the prompt's second group: the step after
    runs the two groups left through their graphs, one after the other (ALR-KVD: its chunk across blocks in its run
    to the end), and the tokens are the eager engine's."""
    engine = layered_engine(tmp_path, max_num_batched_tokens=64, kv_format=kv_format, groups=4)
    bs = engine.cache.block_size
    g = torch.Generator().manual_seed(7)
    chat, prompt = (torch.randint(0, 512, (n,), generator=g).tolist() for n in (20, bs + 9))

    def run():
        engine.add_request(None, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), request_id="chat",
                           prompt_ids=chat)
        out, groups = {}, []
        for step in range(12):
            if step == 1:
                engine.add_request(None, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
                                   request_id="prompt", prompt_ids=prompt)
            out.update((o.request_id, o.token_ids) for o in engine.step() if o.finished)
            groups.append(engine.layered_plan[1:] if engine.layered_plan else None)
        assert not engine.has_unfinished() and engine.cache.allocator.num_free == engine.cache.allocator.num_blocks
        return out, groups

    expected, eager_groups = run()
    taken = graph_layered_steps(engine)
    assert run() == (expected, eager_groups)
    assert eager_groups[1:4] == [(0, 1), (1, 2), (2, 4)]  # (first, last) layers a step: the last two at once
    assert taken == [(first, bs + 9) for first in range(4)]


def test_alrkvd_layered_chunks_across_blocks_hold_a_run_through_the_groups(tmp_path):
    """ALR-KVD (a sequence's newest block in a window slot), layered prefill beside decodes as graphs: a chunk
    across blocks takes a run of window slots and keeps it from its first group of layers to its last, across the
    decodes' steps between (each group writes its layers' keys and values there; the commit after the last group
    compresses the blocks it filled, every layer's). The plans are the eager engine's (where each layer writes and
    compresses as it goes); the tokens those of graphs without layering whose mixed steps hold every chunk beside
    decodes, so that each prompt's rows take one attention path in both runs (the decode kernel where the layered
    run's groups are graphs: the eager engine's flash rounds otherwise, and a random model's near ties flip on CUDA,
    journal 2026-12-07 34b); every block and window slot comes back."""
    engine = layered_engine(tmp_path, max_num_batched_tokens=128, kv_format="alrkvd")
    bs = engine.cache.block_size
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (bs - 4, bs + 3, 2 * bs + 7, bs + 20)]
    _, eager_plans = generate_with_arrivals(engine, prompts, bs + 4, arrivals=(2, 4))
    unlayered = layered_engine(tmp_path, max_num_batched_tokens=128, kv_format="alrkvd", groups=1)
    graph_layered_steps(unlayered, max_tokens=128)
    expected, _ = generate_with_arrivals(unlayered, prompts, bs + 4, arrivals=(2, 4))
    taken = graph_layered_steps(engine, max_tokens=128)
    cache, runs = engine.cache, []
    take_run = cache.take_run

    def recorded(seq, n):  # (chunk rows, run) of the chunks that take one
        take_run(seq, n)
        if id(seq) in cache._runs:
            runs.append((n, cache._runs[id(seq)]))

    cache.take_run = recorded
    tokens, plans = generate_with_arrivals(engine, prompts, bs + 4, arrivals=(2, 4))
    assert plans == eager_plans
    # on CUDA the layered groups' kernel launches differ from the mixed steps' (rows, splits) and round apart: a
    # random model's near ties parted the layered prompts at their 11th and 23rd tokens (H100, journal 35b), where a
    # fault in their runs moves the first token's logits by 2.4
    keep = None if DEVICE == "cpu" else 4
    assert [t[:keep] for t in tokens] == [t[:keep] for t in expected]
    assert sorted(n for n, _ in runs) == [bs + 3, bs + 20, 2 * bs + 7]  # (the first two's step too: a graph's)
    assert sorted(set(taken)) == [(first, n) for first in (0, 2) for n in (bs + 20, 2 * bs + 7)]  # (the arrivals)
    assert cache.allocator.num_free == cache.allocator.num_blocks and len(cache.free_slots) == engine.args.max_num_seqs


def test_the_decode_kernel_takes_a_layered_groups_rows(tmp_path):
    """ALR-KVD: a layered group's graph carries its chunks' rows (up to the step budget, past the mixed steps' graph
    size) through the decode kernel in one launch (`fp16`'s: the tiles kernel): the merge tickets the cache holds
    for it (one per row and KV head) cover them. (Groups of 2,048 rows met tickets for 256 in the first GPU run.)"""
    engine = engine_for(tmp_path, dict(QWEN3_MOE, num_hidden_layers=4, num_experts=16), "alrkvd",
                        layered_prefill=2, max_num_batched_tokens=128, cuda_graph_max_tokens=16)
    assert engine.cache.kernels.decode.keywords["tickets"].numel() >= 128 * engine.cfg.num_kv_heads


def test_alrkvd_chunks_over_long_histories_are_not_layered(tmp_path, monkeypatch):
    """Where a layered group's graph would read a long compressed history through the decode kernel for each row
    (past `GRAPH_MAX_HISTORY_READS`; here any), the chunk goes into mixed steps instead: a 106-token prompt's first
    64 tokens (no history) go through the groups, its last 42 (after two closed blocks) beside the decodes.
    The tokens are the eager engine's."""
    monkeypatch.setattr(cuda_graphs, "GRAPH_MAX_HISTORY_READS", 0)
    engine = layered_engine(tmp_path, max_num_batched_tokens=64, kv_format="alrkvd")
    bs = engine.cache.block_size
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (bs - 4, bs + 3, 3 * bs + 10)]
    expected, _ = generate_with_arrivals(engine, prompts, 8, arrivals=(2,))
    taken = graph_layered_steps(engine)
    tokens, plans = generate_with_arrivals(engine, prompts, 8, arrivals=(2,))
    assert tokens == expected
    assert sorted(set(taken)) == [(0, 64), (2, 64)]
    # (tokens cached before, tokens) of each step: the rest in mixed steps (chunks cut to the graph's 16 rows)
    rest = [n for plan in plans for before, n in plan if before >= 64 and n > 1]
    assert sum(rest) == 3 * bs + 10 - 64


def generate_with_arrivals(engine, prompts, max_tokens: int, arrivals) -> tuple[list, list]:
    """Greedy answers to `prompts`: the first two start together, one more arrives at each step of `arrivals` while
    they decode. Returns the answers and each step's plan, sorted (tokens cached before the step, tokens it takes)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    rids, done, plans = [engine.add_request(None, params, prompt_ids=p) for p in prompts[:2]], {}, []
    for step in range(400):
        if step in arrivals:
            rids.append(engine.add_request(None, params, prompt_ids=prompts[len(rids)]))
        before = {id(s): s.kv.num_tokens for s in engine.running}
        done |= {o.request_id: o.token_ids for o in engine.step() if o.finished}
        plans.append(sorted((before.get(id(s), 0), n) for s, n in engine.plan))
        if not engine.has_unfinished():
            return [done[r] for r in rids], plans
    raise AssertionError("not finished in 400 steps")


@pytest.mark.parametrize("piecewise", [False, True], ids=["whole", "pieces"])
@pytest.mark.parametrize("kv_format", ["alrkvd", "kivi4"])
def test_windowed_mixed_steps_give_the_eager_tokens(tmp_path, kv_format, piecewise):
    """Windowed formats (a sequence's newest block in a window slot), prompt chunks beside decodes: a step whose
    chunks end within their blocks replays the mixed graph (every row read by the decode kernel as a decode of its
    own length). Without `piecewise`, ALR-KVD's chunks may cross blocks in that graph too, each in a run of window
    slots read after the row's closed blocks (`PagedKVCache.take_run`), and KIVI's are cut at their block's end;
    with it, a step with a chunk across a block replays graph pieces with each layer's attention run eagerly between
    them (the history rebuilt, the decodes beside through the decode kernel). The blocks they fill are compressed at
    commit. The reference, with the same
    plan: on CPU every step eager (the kernels' fp32 references stand in for the kernels); on CUDA the same rows
    through the runner uncaptured, since the compiled kernels round keys and values to fp16 for their dots where
    the PyTorch path keeps fp32 (tests/kernels bounds that error), which over many greedy steps can part the
    tokens. Same tokens and routed-token counts (padding not counted); every cache block and window slot back at
    the end."""
    engine = engine_for(tmp_path, QWEN3_MOE, kv_format)
    bs = engine.cache.block_size
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (bs - 4, bs + 20, 2 * bs + 7, bs - 3, bs + 1)]

    def generate():  # newcomers while the first decodes
        engine.reset_routing_counts()
        return generate_with_arrivals(engine, prompts, bs + 4, (2, 4, 6))

    engine.graphs = StepGraphs(engine.model, engine.cache, 0 if DEVICE == "cpu" else 4, engine.max_model_len,
                               max_tokens=2 * bs, capture=False, piecewise=piecewise)  # CPU: every step eager
    expected, eager_plans = generate()
    eager_counts = engine.routing_counts()
    engine.graphs = StepGraphs(engine.model, engine.cache, 4, engine.max_model_len, max_tokens=2 * bs,
                               capture=DEVICE == "cuda", piecewise=piecewise)
    engine.graphs.capture_all()
    TILED.update(rows=0, rows_apart=0)
    assert ("mixed", 2 * bs) in engine.graphs.graphs
    assert (("pieces", 2 * bs) in engine.graphs.graphs) == (piecewise and DEVICE == "cuda")
    tokens, plans = generate()
    assert tokens == expected and plans == eager_plans
    assert torch.equal(engine.routing_counts(), eager_counts)
    # ALR-KVD's mixed graphs read a chunk's rows in tiles, the decodes beside them apart (`rows_apart`; on CPU
    # through the reference that checks them)
    assert (TILED["rows"] > 0) == (TILED["rows_apart"] > 0) == (kv_format == "alrkvd" and DEVICE == "cpu")
    mixed = [p for p in plans if min(n for _, n in p) == 1 and max(n for _, n in p) > 1]  # chunks beside decodes
    within = [all(start % bs + n <= bs for start, n in p) for p in mixed]  # the mixed graph's steps
    across = piecewise or kv_format == "alrkvd"  # and ones with a chunk across blocks (pieces, or a run)
    assert any(within) and all(within) != across
    assert any((start + n) % bs == 0 for p in mixed for start, n in p)  # and rows that close their block
    cache = engine.cache
    assert cache.allocator.num_free == cache.allocator.num_blocks and len(cache.free_slots) == engine.args.max_num_seqs


@pytest.mark.parametrize("apart", [0, 2, 1 << 10])
def test_alrkvd_mixed_steps_with_the_leading_rows_apart_give_the_eager_tokens(tmp_path, apart):
    """`rows_apart`: a mixed graph step's first rows (its decodes come first) read one by one in a decode launch of
    their own, the other rows in tiles from there on: the eager tokens and plans (the reference as in
    `test_windowed_mixed_steps_give_the_eager_tokens`); on the CPU the reference sees both launches, the tiles
    holding no row before the first two, or (more rows apart than any graph holds) no tiles at all, or (none apart)
    every row in tiles."""
    engine = engine_for(tmp_path, QWEN3_MOE, "alrkvd")
    bs = engine.cache.block_size
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (bs - 4, bs + 20, 2 * bs + 7, bs - 3, bs + 1)]

    def generate():
        return generate_with_arrivals(engine, prompts, bs + 4, (2, 4, 6))

    engine.graphs = StepGraphs(engine.model, engine.cache, 0 if DEVICE == "cpu" else 4, engine.max_model_len,
                               max_tokens=2 * bs, capture=False)  # CPU: every step eager
    expected, eager_plans = generate()
    engine.cache.rows_apart = apart
    engine.graphs = StepGraphs(engine.model, engine.cache, 4, engine.max_model_len, max_tokens=2 * bs,
                               capture=DEVICE == "cuda")
    engine.graphs.capture_all()
    TILED.update(rows=0, rows_apart=0)
    tokens, plans = generate()
    assert tokens == expected and plans == eager_plans
    if DEVICE == "cpu":
        assert (TILED["rows_apart"] > 0) == (apart > 0) and (TILED["rows"] > 0) == (apart < 1 << 10)
    else:  # (the kernels, not the reference)
        assert TILED["rows"] == TILED["rows_apart"] == 0


def test_prompts_across_blocks_without_decodes_beside_take_runs(tmp_path):
    """ALR-KVD, steps of prompts alone: a chunk across its block's end that fits a run of window slots takes one, so
    a step a mixed graph holds replays it; one that is longer than a run, or a step larger than the graphs, attends
    eagerly (its chunks keep their runs). A step once replayed the graph without a run: the rows past the block
    wrote over the block's window slot, and the first token's logits moved by 2.4. Tokens as the engine's without
    graphs; every block and window slot comes back."""
    engine = engine_for(tmp_path, dict(QWEN3_MOE, num_hidden_layers=4, num_experts=16), "alrkvd")
    bs = engine.cache.block_size
    g = torch.Generator().manual_seed(7)
    groups = [(bs + 3,), (bs - 4, 2 * bs), (2 * bs, 3 * bs), (5 * bs + 1,)]  # prompts that start together
    prompts = [[torch.randint(0, 512, (n,), generator=g).tolist() for n in lens] for lens in groups]

    def generate():
        return [generate_with_arrivals(engine, p, 4, arrivals=())[0] for p in prompts]

    expected = generate()
    engine.graphs = graphs = StepGraphs(engine.model, engine.cache, 2, engine.max_model_len, max_tokens=4 * bs,
                                        capture=DEVICE == "cuda")
    graphs.capture_all()
    assert engine.cache.run_blocks * bs == 5 * bs  # (a run holds the graph's 4 blocks of rows from any offset)
    run, take_run, prompt_steps, runs = graphs.run, engine.cache.take_run, [], []

    def recorded(tokens, positions, batch):  # whether each step of prompts went to a graph
        hidden = run(tokens, positions, batch)
        if max(batch.query_lens) > 1:
            prompt_steps.append(hidden is not None)
        return hidden

    def recorded_run(seq, n):
        take_run(seq, n)
        runs.append((n, id(seq) in engine.cache._runs))

    graphs.run, engine.cache.take_run = recorded, recorded_run
    assert generate() == expected
    assert prompt_steps == [True, True, False, False]  # (160 rows: more than a graph's 128; a prompt of 161 alone)
    assert runs == [(bs + 3, True), (bs - 4, False), (2 * bs, True), (2 * bs, True), (3 * bs, True),
                    (5 * bs + 1, False)]
    cache = engine.cache
    assert cache.allocator.num_free == cache.allocator.num_blocks and len(cache.free_slots) == engine.args.max_num_seqs


@pytest.mark.parametrize("piecewise", [False, True], ids=["whole", "pieces"])
def test_prompt_rows_over_long_compressed_histories_attend_eagerly(tmp_path, monkeypatch, piecewise):
    """A mixed step whose prompt rows would read more compressed history through the decode kernel than
    `GRAPH_MAX_HISTORY_READS` (here: any; a prompt's last 2 tokens within its second block) attends eagerly, its
    history rebuilt once: the whole step, or with `piecewise` between graph pieces; the others replay the mixed graph,
    chunks in runs of window slots too. The tokens are the eager steps'."""
    monkeypatch.setattr(cuda_graphs, "GRAPH_MAX_HISTORY_READS", 0)
    engine = engine_for(tmp_path, QWEN3_MOE, "alrkvd")
    bs = engine.cache.block_size
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (bs - 4, bs + 20, 2 * bs, bs - 3)]
    engine.graphs = StepGraphs(engine.model, engine.cache, 0, engine.max_model_len, max_tokens=2 * bs, capture=False)
    expected, eager_plans = generate_with_arrivals(engine, prompts, bs + 4, (2, 4))
    engine.graphs = graphs = StepGraphs(engine.model, engine.cache, 4, engine.max_model_len, max_tokens=2 * bs,
                                        capture=DEVICE == "cuda", piecewise=piecewise)
    graphs.capture_all()
    steps, run, run_pieces = [], graphs.run, graphs._run_pieces
    pieces = []
    graphs._run_pieces = lambda *args: pieces.append(1) or run_pieces(*args)

    def recorded(tokens, positions, batch):
        reads, before = engine.cache.history_reads(batch), len(pieces)
        hidden = run(tokens, positions, batch)
        if any(n > 1 for n in batch.query_lens) and any(n == 1 for n in batch.query_lens):  # chunks beside decodes
            steps.append((reads, "eager" if hidden is None else "pieces" if len(pieces) > before else "graph"))
        return hidden

    graphs.run = recorded
    tokens, plans = generate_with_arrivals(engine, prompts, bs + 4, (2, 4))
    assert tokens == expected and plans == eager_plans
    heavy = "pieces" if piecewise else "eager"
    assert all(kind == ("graph" if reads == 0 else heavy) for reads, kind in steps)
    assert {kind for _, kind in steps} == {"graph", heavy}


@pytest.mark.parametrize("kv_format, runs", [("alrkvd", True), ("kivi4", False)])
def test_runs_of_window_slots_are_counted_in_the_allocated_bytes_and_used_by_no_sequence(tmp_path, kv_format, runs):
    """Graphs that read every row as a decode give ALR-KVD two runs of window slots for chunks across blocks (its
    decode kernel takes `closed`; KIVI's does not): as many slots as a graph step's chunk can touch, in the allocated
    bytes (beside the budget's), never in the used bytes or the sequences' free slots."""
    engine = engine_for(tmp_path, QWEN3_MOE, kv_format)
    cache = engine.cache
    bs, allocated, free = cache.block_size, cache.allocated_bytes(), list(cache.free_slots)
    StepGraphs(engine.model, cache, 4, engine.max_model_len, max_tokens=2 * bs, capture=False)
    slot = cache.window_k[:, 0].numel() * cache.window_k.element_size() * 2  # keys and values, every layer
    assert len(cache.window_runs) == (2 if runs else 0) and cache.run_blocks == (3 if runs else 1)  # 2 * bs - 1 rows
    assert cache.allocated_bytes() - allocated == (2 * 3 * slot if runs else 0)
    assert cache.free_slots == free and cache.used_bytes() == 0
    StepGraphs(engine.model, cache, 4, engine.max_model_len, max_tokens=2 * bs, capture=False)  # (graphs again)
    assert cache.allocated_bytes() - allocated == (2 * 3 * slot if runs else 0)


def test_a_chunk_takes_a_run_only_where_a_free_one_holds_it(tmp_path):
    """`piecewise_graphs` does not cut chunks to `mixed_chunk_limit`, so a step may bring more chunks across blocks
    than there are runs, or one longer than a run: those take none (their step's attention runs eagerly, in graph
    pieces), and the runs go to the chunks they hold."""
    engine = engine_for(tmp_path, QWEN3_MOE, "alrkvd")
    cache = engine.cache
    StepGraphs(engine.model, cache, 4, engine.max_model_len, max_tokens=2 * cache.block_size, capture=False)
    span = cache.run_blocks * cache.block_size  # (3 blocks)
    seqs = [SeqKV() for _ in range(4)]
    for seq, n in zip(seqs, (span + 1, span, span, span)):
        cache.allocate(seq, n)
        cache.take_run(seq, n)
    assert [id(seq) in cache._runs for seq in seqs] == [False, True, True, False]
    assert sorted(cache._runs.values()) == cache.window_runs
    cache.release_runs()
    for seq in seqs:
        cache.free(seq)


def test_warm_up_runs_chunks_across_blocks_and_over_a_history_and_leaves_nothing_behind(tmp_path):
    """`LLMEngine.warm_up` (the server's, on CUDA, after the captures) runs what a first request would compile: a
    prompt chunk across blocks beside a decode (graph pieces) and one over a cached history. After it the engine is
    as before: the same greedy tokens, every block and window slot free, the step-time curve and the routing counts
    untouched."""
    engine = engine_for(tmp_path, QWEN3_MOE, "alrkvd")
    bs = engine.cache.block_size
    engine.graphs = StepGraphs(engine.model, engine.cache, 4, engine.max_model_len, max_tokens=2 * bs,
                               capture=DEVICE == "cuda", piecewise=True)
    engine.graphs.capture_all()
    engine.step_cost = StepCost(target_ms=50.0)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (bs + 5, 2 * bs + 3, bs - 2)]
    expected, _ = generate_with_arrivals(engine, prompts, 6, (2,))
    engine.step_cost = step_cost = StepCost(target_ms=50.0)
    engine.reset_routing_counts()

    steps, step = [], engine.step

    def recorded():
        before = {id(s): s.kv.num_tokens for s in engine.running}
        outputs = step()
        steps.append([(before.get(id(s), 0), n) for s, n in engine.plan])
        return outputs
    engine.step = recorded
    assert engine.warm_up() > 0
    del engine.step
    beside = [p for p in steps if any(n == 1 for _, n in p)]
    assert any(start // bs != (start + n - 1) // bs for p in beside for start, n in p if n > 1)  # across blocks
    assert any(start > 0 and n > 1 for p in beside for start, n in p)  # over a cached history
    assert not engine.requests and engine.step_cost is step_cost and step_cost.steps == 0 and not step_cost.curve
    assert not engine.routing_counts().any()
    cache = engine.cache
    assert cache.allocator.num_free == cache.allocator.num_blocks and len(cache.free_slots) == engine.args.max_num_seqs
    tokens, _ = generate_with_arrivals(engine, prompts, 6, (2,))
    assert tokens == expected


@pytest.mark.parametrize("limits", [dict(max_model_len=64), dict(max_output_tokens=1), dict(kv_budget_bytes=400 << 10),
                                    dict(max_num_seqs=1, max_num_batched_tokens=1)])
def test_warm_up_within_the_engine_limits(tmp_path, limits):
    """A short context, a one-token output limit, a small cache or one-token steps: the warm-up fits in them or does
    nothing (a request it made beyond them would have failed the server's start)."""
    engine = engine_for(tmp_path, QWEN3_MOE, "alrkvd", **limits)
    engine.warm_up()
    assert not engine.requests and engine.cache.allocator.num_free == engine.cache.allocator.num_blocks


def test_compression_graphs_store_what_the_kernel_call_stores(tmp_path):
    """ALR-KVD's compression of full blocks through `CompressGraphs` (on CUDA two captured graphs around the host's
    eigh, the first call capturing and the second replaying; on CPU the same static buffers eagerly, the kernels
    under the interpreter): every layer's block of one sequence (a size of its own), of three (padded up to four
    sequences' with blocks of zeros) and of five (to eight) store what one `encode_with_kernel` call stores, and
    nothing else changes but the scratch block."""
    engine = engine_for(tmp_path, QWEN3_MOE, "alrkvd", attention_backend="triton")
    cache, fmt = engine.cache, engine.cache.format
    graphs = CompressGraphs(cache, capture=DEVICE == "cuda")
    assert cache.compress_blocks == fmt.encode_with_kernel and graphs.sizes == [2, 4, 8, 16, 32, 64, 128]
    T, H, D, L = cache.block_size, 2, 64, 2
    g = torch.Generator().manual_seed(7)
    kept = slice(0, cache.scratch_block)  # every block but the scratch one, in every layer
    for seqs in ([3], [0, 5, 2], [1, 4, 6, 7, 8]):
        layers, ids = [layer for _ in seqs for layer in range(L)], [b for b in seqs for _ in range(L)]
        k, v = (torch.randn(len(ids), T, H, D, generator=g).to(DEVICE) for _ in range(2))
        starts = [T * (b + 1) for b in ids]
        before = {name: t.clone() for name, t in fmt.named_tensors().items()}
        fmt.encode_with_kernel(layers, ids, k, v, start_pos=starts)
        want = {name: t.clone() for name, t in fmt.named_tensors().items()}
        for _ in range(2 if DEVICE == "cuda" else 1):
            for name, t in fmt.named_tensors().items():
                t.copy_(before[name])
            graphs(layers, ids, k, v, starts)
            for name, t in fmt.named_tensors().items():
                assert torch.equal(t[:, kept], want[name][:, kept]), name
        assert any(not torch.equal(t[:, kept], before[name][:, kept]) for name, t in fmt.named_tensors().items())
    assert sorted(graphs.graphs) == [2, 8, 16]


@pytest.mark.parametrize("kv_format", ["alrkvd", "kivi4"])
def test_windowed_eager_steps_read_decodes_with_the_kernel(tmp_path, kv_format):
    """Eager steps (no graph) that carry prompt chunks beside decodes: the decodes are read all at once, by the decode
    kernel from the compressed blocks (the fp32 reference stands in for it on every device) or on the PyTorch path
    by one batched decode (`_attend_windows`), the chunks one by one, uncut across blocks; a block a decode fills is
    compressed at commit. The same tokens as every sequence one by one; every block and window slot back."""
    engine = engine_for(tmp_path, QWEN3_MOE, kv_format)
    bs = engine.cache.block_size
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (bs - 6, bs - 2, 2 * bs + 7, bs + 20, 3)]

    def generate():  # newcomers while the first two decode
        return generate_with_arrivals(engine, prompts, bs + 4, (2, 5, 8))

    engine.cache.decode_kernel = REFERENCES[kv_format]
    tokens, plans = generate()
    mixed = [p for p in plans if min(n for _, n in p) == 1 and max(n for _, n in p) > 1]
    assert any(start % bs + n > bs for p in mixed for start, n in p if n > 1)  # chunks cross blocks beside decodes
    assert any((start + 1) % bs == 0 for p in mixed for start, n in p if n == 1)  # a decode closes its block
    engine.cache.decode_kernel = None  # the PyTorch path: the decodes in one batched call
    assert generate() == (tokens, plans)
    engine.cache.windows_at_once = False  # every sequence one by one
    assert generate() == (tokens, plans)
    cache = engine.cache
    assert cache.allocator.num_free == cache.allocator.num_blocks and len(cache.free_slots) == engine.args.max_num_seqs


def test_seeded_routing_runs_the_same_experts_whatever_the_activations(tmp_path):
    """`moe_routing="seeded"` (dummy-weight benchmarks): experts from each token's position and row, so two KV
    formats, whose attention outputs differ, route every step to the same experts; learned routing does not
    promise that. Graph replays route as eager steps do."""
    counts = {}
    for kv_format in ("fp16", "kivi4"):
        (tmp_path / kv_format).mkdir()
        (tmp_path / kv_format / "config.json").write_text(json.dumps(QWEN3_MOE))
        engine = LLMEngine(EngineArgs(model=str(tmp_path / kv_format), load_format="dummy", tokenizer="none",
                                      device=DEVICE, dtype="float32", kv_format=kv_format, max_num_seqs=4,
                                      moe_routing="seeded"))
        if DEVICE == "cpu":
            engine.cache.decode_kernel = REFERENCES[kv_format]
        engine.graphs = StepGraphs(engine.model, engine.cache, 4, engine.max_model_len, capture=DEVICE == "cuda")
        engine.graphs.capture_all()
        engine.reset_routing_counts()
        g = torch.Generator().manual_seed(2)
        for n in (40, 7, 150):
            engine.add_request(None, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True),
                               prompt_ids=torch.randint(0, 512, (n,), generator=g).tolist())
        while engine.has_unfinished():
            engine.step()
        counts[kv_format] = engine.routing_counts()
    assert counts["fp16"].sum() == 2 * 2 * (40 + 7 + 150 + 3 * 29)  # every token, in 2 layers, to top_k = 2 experts
    assert torch.equal(counts["fp16"], counts["kivi4"])
    moe = next(m for m in engine.model.modules() if isinstance(m, MoE))
    x = torch.randn(5, QWEN3_MOE["hidden_size"], device=DEVICE)
    moe.route_keys = torch.arange(5, device=DEVICE)
    assert torch.equal(moe.route(x)[1], moe.route(-x)[1])  # the experts do not depend on the hidden state


def test_local_routing_has_the_measured_locality(tmp_path):
    """`moe_routing="local"` (dummy-weight benchmarks of expert caching): tables whose busiest expert and reuse by
    the next token are SmolLM2-MoE's (LOCALITY), reproducible; through the engine, a decoding sequence's
    consecutive tokens reuse experts at that rate, where uniform seeded routing gives top_k / experts."""
    routes = local_routes(128, 8, 4096, *LOCALITY, seed=1)
    assert torch.equal(routes, local_routes(128, 8, 4096, *LOCALITY, seed=1))
    onehot = torch.zeros(4096, 128).scatter_(1, routes, 1.0)
    assert (onehot.sum(1) == 8).all()  # eight distinct experts a token
    assert abs(onehot.sum(0).max().item() * 128 / routes.numel() - LOCALITY[0]) < 0.2
    assert abs((onehot[1:] * onehot[:-1]).sum(1).mean().item() / 8 - LOCALITY[1]) < 0.03
    reuse = {}
    for routing in ("local", "seeded"):
        (tmp_path / routing).mkdir()
        (tmp_path / routing / "config.json").write_text(json.dumps({**QWEN3_MOE, "num_experts": 16}))
        engine = LLMEngine(EngineArgs(model=str(tmp_path / routing), load_format="dummy", tokenizer="none",
                                      device=DEVICE, dtype="float32", max_num_seqs=1, moe_routing=routing,
                                      enforce_eager=True))
        moe = next(m for m in engine.model.modules() if isinstance(m, MoE))
        chosen, route = [], moe.route

        def recording_route(x, route=route, chosen=chosen):  # the first MoE layer's choices, step by step
            weights, ids = route(x)
            chosen.append(ids)
            return weights, ids
        moe.route = recording_route
        engine.add_request(None, SamplingParams(max_tokens=400, temperature=0, ignore_eos=True), prompt_ids=[1, 2])
        while engine.has_unfinished():
            engine.step()
        ids = torch.cat(chosen[1:]).cpu()  # the decode steps, one token each
        onehot = torch.zeros(len(ids), 16).scatter_(1, ids, 1.0)
        reuse[routing] = (onehot[1:] * onehot[:-1]).sum(1).mean().item() / 2
    assert abs(reuse["local"] - LOCALITY[1]) < 0.08 and abs(reuse["seeded"] - 2 / 16) < 0.06, reuse

