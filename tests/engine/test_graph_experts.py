"""Expert streaming decided on the device (backend/graph_experts.py), on the CPU: the slot bookkeeping
stays a bijection whose slots hold their experts' weights and never gives one pass two experts in one slot;
outputs equal the resident experts' in one pass and in several; whole models served with a tiny budget
give the resident model's tokens, through the graph runner's static buffers as well (the capture itself
runs on the H200: BENCHMARKS.md). The copy kernel and the fused MoE run under Triton's interpreter here."""
from kernels.testing import use_interpreter_without_gpu

DEVICE = use_interpreter_without_gpu()

import json  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from backend.cuda_graphs import StepGraphs  # noqa: E402
from backend.engine import LOCALITY, PREGATING_RECALL, EngineArgs, LLMEngine  # noqa: E402
from backend.experts import ExpertStore, expert_nbytes  # noqa: E402
from backend.graph_experts import DeviceExpertCache  # noqa: E402
from backend.model import blur_routes, local_routes  # noqa: E402
from backend.sampling import SamplingParams  # noqa: E402
from kernels.expert_copy import copy_rows, copy_rows_ref  # noqa: E402
from kernels.moe_reference import grouped_experts  # noqa: E402
from kernels.paged_attention import paged_decode_attention_ref  # noqa: E402

E, H, I, K = 8, 16, 8, 2
LAYERS = (0, 1, 2)


def make_cache(slots, kernel="torch", policy="lru", prefetch=True, seed=0) -> DeviceExpertCache:
    g = torch.Generator().manual_seed(seed)
    pin = (lambda t: t.pin_memory()) if DEVICE == "cuda" else (lambda t: t)  # the copy kernel reads host memory
    store = ExpertStore({l: pin(torch.randn(E, 2 * I, H, generator=g)) for l in LAYERS},
                        {l: pin(torch.randn(E, H, I, generator=g)) for l in LAYERS})
    routers = {l: nn.Linear(H, E, bias=False, device=DEVICE) for l in LAYERS}
    for r in routers.values():
        r.weight.data = torch.randn(E, H, generator=g).to(DEVICE)
    return DeviceExpertCache(store, routers, K, slots * store.expert_bytes * len(LAYERS), DEVICE, prefetch,
                             policy, kernel)


def resident_output(cache, layer, x, weights, ids):
    st = cache.store
    return grouped_experts(x, weights, ids, E, lambda e: (st.w13[layer][e, :I], st.w13[layer][e, I:], st.w2[layer][e]))


def check_bookkeeping(cache):
    """slot_of and holder are inverse maps, and every held slot holds its expert's weights."""
    S = cache.slots_per_layer
    for li, layer in enumerate(LAYERS):
        held = cache.holder[li, :S].tolist()
        slot_of = cache.slot_of[li, :E].tolist()
        for j, e in enumerate(held):
            if e != E:
                assert slot_of[e] == li * S + j
                assert torch.equal(cache.w13[li * S + j].cpu(), cache.store.w13[layer][e])  # the store: host memory
                assert torch.equal(cache.w2[li * S + j].cpu(), cache.store.w2[layer][e])
        assert sorted(s for s in slot_of if s >= 0) == sorted(li * S + j for j, e in enumerate(held) if e != E)


def test_copy_kernel_moves_only_the_valid_rows():
    src = torch.randn(6, 3, 5)
    dst, expected = torch.zeros(4, 3, 5), torch.zeros(4, 3, 5)
    src_rows, dst_rows = torch.tensor([5, 0, 2, 3]), torch.tensor([1, 3, 0, 2])
    valid = torch.tensor([True, False, True, True])
    host = src.pin_memory() if DEVICE == "cuda" else src  # on CUDA the kernel reads pinned host memory
    copy_rows(host, dst := dst.to(DEVICE), src_rows.to(DEVICE), dst_rows.to(DEVICE), valid.to(DEVICE),
              block=4, programs=2)  # two programs share each row's four chunks
    copy_rows_ref(src, expected, src_rows, dst_rows, valid)
    assert torch.equal(dst.cpu(), expected) and expected[3].abs().sum() == 0 and torch.equal(expected[1], src[5])


@pytest.mark.parametrize("kernel", ["torch", "triton"])
@pytest.mark.parametrize("slots,tokens", [(4, 1), (4, 3), (2, 5)], ids=["one-pass", "full-pass", "three-passes"])
def test_outputs_equal_the_resident_experts(kernel, slots, tokens):
    """Steps of `tokens` tokens through three layers; the union of a layer's experts needs up to
    ceil(min(tokens * K, E) / slots) passes, each with slots the bookkeeping hands out distinct."""
    cache = make_cache(slots, kernel)
    g = torch.Generator().manual_seed(1)
    for step in range(6):
        for layer in LAYERS:
            x = torch.randn(tokens, H, generator=g)
            weights, ids = torch.topk(torch.rand(tokens, E, generator=g).softmax(-1), K, dim=-1)
            out = cache.run(layer, x.to(DEVICE), weights.to(DEVICE), ids.to(DEVICE)).cpu()
            tol = 1e-2 if DEVICE == "cuda" else 1e-4  # the fused kernel's tf32 dots on CUDA
            torch.testing.assert_close(out, resident_output(cache, layer, x, weights, ids), rtol=tol, atol=tol)
            check_bookkeeping(cache)
    st = cache.stats()
    assert st["expert_hits"] + st["expert_misses"] > 0 and st["expert_misses"] > 0
    assert st["expert_prefetch_copies"] > 0 and st["expert_tokens"] == 6 * tokens


def test_lru_evicts_the_least_recently_used_and_lfu_the_least_used():
    def after(policy):
        cache = make_cache(3, policy=policy, prefetch=False)
        x = torch.randn(1, H)
        for pair in ([0, 1], [0, 2], [0, 1], [3, 4]):  # 0 used three times, 1 twice, 2 once; 1 then 2 least recent
            cache.run(0, x.to(DEVICE), torch.full((1, K), 0.5, device=DEVICE), torch.tensor([pair], device=DEVICE))
        return cache.resident_experts(0)

    # [3, 4] needs two slots: LRU keeps the most recent (0, from the third step: 0 and 1 tie, one of them goes);
    # LFU drops 2 (used once) and then the less used of 0 and 1
    lru = after("lru")
    assert 3 in lru and 4 in lru and 2 not in lru and len(lru) == 3
    assert after("lfu") == [0, 3, 4]


def test_prefetch_places_the_next_layers_predicted_experts():
    cache = make_cache(4)
    x = torch.randn(1, H)
    cache.run(0, x.to(DEVICE), torch.full((1, K), 0.5, device=DEVICE), torch.tensor([[0, 1]], device=DEVICE))
    probs = cache.routers[1](x.to(DEVICE)).softmax(-1).cpu()
    predicted = set(torch.topk(probs, K).indices[0].tolist())
    assert predicted <= set(cache.resident_experts(1))  # placed before layer 1 runs
    assert cache.stats()["expert_prefetch_copies"] == K


QWEN3_MOE = dict(model_type="qwen3_moe", vocab_size=512, hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, intermediate_size=256, moe_intermediate_size=64, num_experts=8,
                 num_experts_per_tok=2, norm_topk_prob=True, rms_norm_eps=1e-6, rope_theta=1e6,
                 max_position_embeddings=1024, tie_word_embeddings=False)


@pytest.mark.parametrize("slots", [1, 3])
def test_tiny_budget_gives_the_resident_tokens_through_the_graph_runner(tmp_path, slots):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_MOE))

    def engine(**kw):
        return LLMEngine(EngineArgs(model=str(tmp_path), load_format="dummy", tokenizer="none", device=DEVICE,
                                    dtype="float32", kv_format="fp16", max_num_seqs=4, enforce_eager=True, **kw))

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (11, 29, 40)]

    def generate(e):
        rids = [e.add_request(None, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True), prompt_ids=p)
                for p, n in zip(prompts, (6, 12, 9))]
        done = {}
        while e.has_unfinished():
            done |= {o.request_id: o.token_ids for o in e.step() if o.finished}
        return [done[r] for r in rids]

    expected = generate(engine())
    budget = slots * expert_nbytes(128, 64, torch.float32) * 3
    streamed = engine(expert_budget_bytes=budget, expert_decisions="device")
    assert isinstance(streamed.model.expert_cache, DeviceExpertCache)
    assert generate(streamed) == expected  # eager steps
    if DEVICE == "cpu":
        streamed.cache.decode_kernel = paged_decode_attention_ref
    assert StepGraphs.supported(streamed.model, streamed.cache) == (DEVICE == "cuda")
    streamed.graphs = StepGraphs(streamed.model, streamed.cache, 4, streamed.max_model_len, capture=DEVICE == "cuda")
    streamed.model.expert_cache.reset_stats()
    assert generate(streamed) == expected  # decode steps through the graph runner's static buffers
    assert sorted(streamed.graphs.graphs) == [("decode", b) for b in (1, 2, 3)]
    stats = streamed.stats()
    assert stats["expert_misses"] > 0 and stats["expert_decisions"] == "device"


def test_bad_decisions_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_MOE))
    with pytest.raises(ValueError, match="expert_decisions"):
        LLMEngine(EngineArgs(model=str(tmp_path), load_format="dummy", tokenizer="none", expert_decisions="gpu"))


def test_local_routing_is_predicted_at_the_measured_recall(tmp_path):
    """`moe_routing="local"`: the prefetcher names a layer's experts from tables that keep PREGATING_RECALL of
    them (`blur_routes`: a trained router's predictability from the previous layer), so a streamed model's
    prefetch recall is that, where a dummy router, unrelated to the tables, would name top_k / experts."""
    routes = local_routes(128, 8, 4096, *LOCALITY, seed=1)
    blurred = blur_routes(routes, 128, PREGATING_RECALL, seed=2)
    onehot = torch.zeros(4096, 128)
    assert (onehot.scatter(1, blurred, 1.0).sum(1) == 8).all()  # still eight distinct experts a row
    kept = (onehot.scatter(1, routes, 1.0) * onehot.scatter(1, blurred, 1.0)).sum(1).mean().item() / 8
    assert abs(kept - PREGATING_RECALL) < 0.02
    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_MOE, "num_experts": 16}))
    budget = 8 * expert_nbytes(128, 64, torch.float32) * 3
    engine = LLMEngine(EngineArgs(model=str(tmp_path), load_format="dummy", tokenizer="none", device=DEVICE,
                                  dtype="float32", max_num_seqs=1, moe_routing="local", enforce_eager=True,
                                  expert_budget_bytes=budget, expert_decisions="device"))
    engine.add_request(None, SamplingParams(max_tokens=300, temperature=0, ignore_eos=True), prompt_ids=[1, 2])
    while engine.has_unfinished():
        engine.step()
    assert abs(engine.stats()["expert_prefetch_recall"] - PREGATING_RECALL) < 0.06


def test_graph_padding_rows_stream_no_experts(tmp_path):
    """A mixed-step graph pads its rows to the bucket (backend/cuda_graphs.py); the padding takes the first row's
    experts at weight 0, so the layer asks the cache for the step's own experts only and its rows are unchanged."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_MOE))
    engine = LLMEngine(EngineArgs(model=str(tmp_path), load_format="dummy", tokenizer="none", device=DEVICE,
                                  dtype="float32", enforce_eager=True, expert_decisions="device",
                                  expert_budget_bytes=4 * expert_nbytes(128, 64, torch.float32) * 3))
    moe = engine.model.layers[0].mlp
    asked = []
    run = moe.experts.run
    moe.experts.run = lambda x, weights, ids: asked.append(set(ids.flatten().tolist())) or run(x, weights, ids)
    x = torch.randn(16, 128, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    own = moe(x[:5])
    moe.valid_rows = torch.arange(16, device=DEVICE) < 5
    padded = moe(x)
    moe.valid_rows = None
    assert asked[1] == asked[0] and len(asked[0]) < 8  # no expert beyond the step's own
    torch.testing.assert_close(padded[:5], own)


def test_bench_experts_graphs_smoke(tmp_path):
    """benchmarks/bench_experts.py --graphs --smoke: the H200 benchmark's code paths on tiny CPU shapes; every
    streamed row, device- or host-decided, gives the resident slice's outputs exactly."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_experts.py"
    spec = importlib.util.spec_from_file_location("bench_experts", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    assert bench.main(["--smoke", "--graphs", "--steps", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["models"]["smoke"]["rows"]
    assert len(rows) == 16 and all("error" not in r for r in rows)
    assert all(r["exact_vs_resident"] for r in rows)
    assert {r["decisions"] for r in rows} == {"device", "host"} and {r["routing"] for r in rows} == {"local", "uniform"}
