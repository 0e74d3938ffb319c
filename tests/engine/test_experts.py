"""Expert streaming (backend/experts.py) on the CPU: slot bookkeeping, eviction policies, pre-gating
predictions, outputs equal to the resident experts, and whole models served with a tiny expert
budget giving exactly the tokens of the model with every expert resident.

On the CPU the store and the cache are both CPU tensors and copies are synchronous; the CUDA
streams and events are exercised by benchmarks/bench_experts.py on the GPU.
"""
from kernels.testing import use_interpreter_without_gpu

DEVICE = use_interpreter_without_gpu()  # the Triton path of the cache runs under the interpreter

import functools  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import transformers  # noqa: E402

from backend.engine import EngineArgs, LLMEngine  # noqa: E402
from backend.experts import ExpertCache, ExpertStore, expert_nbytes  # noqa: E402
from backend.sampling import SamplingParams  # noqa: E402
from backend.tokenizer import Tokenizer  # noqa: E402
from kernels.moe_reference import grouped_experts  # noqa: E402

E, H, I = 6, 8, 4
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_experts.py"


def make_cache(slots=2, layers=(0, 1, 2), top_k=2, prefetch=0, policy="lru", kernel="torch", seed=0,
               routers=None, hidden=H, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    pin = device != "cpu"
    w13 = {l: torch.randn(E, 2 * I, hidden, generator=g) for l in layers}
    w2 = {l: torch.randn(E, hidden, I, generator=g) for l in layers}
    store = ExpertStore({l: w.pin_memory() if pin else w for l, w in w13.items()},
                        {l: w.pin_memory() if pin else w for l, w in w2.items()})
    if routers is None:
        routers = {}
        for l in layers:
            routers[l] = nn.Linear(hidden, E, bias=False, device=device)
            routers[l].weight.data = torch.randn(E, hidden, generator=g).to(device)
    budget = None if slots is None else slots * store.expert_bytes * len(layers)
    return ExpertCache(store, routers, top_k, budget, device, prefetch, policy, kernel)


def route(T, top_k, seed, num_experts=E):
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(T, num_experts, generator=g).softmax(-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), ids


def resident_output(cache, layer, x, weights, ids):
    st = cache.store
    return grouped_experts(x, weights, ids, E, lambda e: (st.w13[layer][e, :I], st.w13[layer][e, I:],
                                                         st.w2[layer][e]))


def run_ids(cache, layer, ids, x=None):
    ids = torch.tensor(ids)
    x = torch.randn(ids.shape[0], H) if x is None else x
    return cache.run(layer, x, torch.ones(ids.shape, dtype=x.dtype) / ids.shape[1], ids)


# ---- budget, slots, policies ------------------------------------------------------------------
def test_budget_sizes_per_layer_slots():
    assert expert_nbytes(H, I, torch.float32) == 3 * H * I * 4
    assert make_cache(slots=2).slots_per_layer == 2
    assert make_cache(slots=100).slots_per_layer == E  # capped at the experts of a layer
    full = make_cache(slots=None)
    assert full.static and (full.slot_table >= 0).all()
    assert full.w13.shape == (3 * E, 2 * I, H) and full.stats()["expert_bytes_streamed"] == 0
    with pytest.raises(ValueError, match="less than one expert per MoE layer"):
        make_cache(slots=0)
    with pytest.raises(ValueError, match="policy"):
        make_cache(policy="mru")


def test_lru_slot_bookkeeping():
    c = make_cache(slots=2)
    assert c.acquire(0, [3, 1]) == [0, 1]  # layer 0 owns slots 0 and 1, layer 1 slots 2 and 3
    assert c.slot_table[0].tolist() == [-1, 1, -1, 0, -1, -1]
    torch.testing.assert_close(c.w13[0], c.store.w13[0][3], rtol=0, atol=0)
    torch.testing.assert_close(c.w2[1], c.store.w2[0][1], rtol=0, atol=0)
    c.acquire(0, [3])  # touch 3: expert 1 is now the least recently used
    assert c.acquire(0, [5]) == [1]
    assert c.slot_table[0].tolist() == [-1, -1, -1, 0, -1, 1] and c.counters.evictions == 1
    assert c.acquire(1, [0]) == [2]  # other layers' slots are untouched
    assert c.slot_table[0].tolist() == [-1, -1, -1, 0, -1, 1]
    # a step's experts are never evicted for each other; others needed later ("soft") only last
    assert c.acquire(0, [0], soft=[3]) == [1]  # evicts 5 (not LRU 3, which is needed later)
    c.acquire(0, [2, 4])
    assert sorted(c.resident[0]) == [2, 4] and sorted(c.resident[0].values()) == [0, 1]
    with pytest.raises(RuntimeError):
        c.acquire(0, [0, 1, 3])  # more experts than slots at once
    for li in range(3):  # the host slot table mirrors the residency
        assert {e: s for e, s in enumerate(c.slot_table[li].tolist()) if s >= 0} == dict(c.resident[li])


@pytest.mark.parametrize("policy, evicted", [("lru", 0), ("lfu", 1)])
def test_eviction_policies(policy, evicted):
    c = make_cache(slots=2, top_k=1, policy=policy)
    for e in (0, 0, 0, 1):  # expert 0: used often, long ago; expert 1: once, recently
        run_ids(c, 0, [[e]])
    run_ids(c, 0, [[2]])
    assert evicted not in c.resident[0] and 2 in c.resident[0]
    s = c.stats()
    assert (s["expert_hits"], s["expert_misses"], s["expert_evictions"]) == (2, 3, 1)
    assert s["expert_hit_rate"] == pytest.approx(2 / 5)
    assert s["expert_bytes_streamed"] == 3 * c.store.expert_bytes and s["expert_tokens"] == 5


# ---- prediction -------------------------------------------------------------------------------
def permutation_routers(perms, scale=10.0):
    """Layer l's router sends the one-hot token e_i to expert perms[l][i] (H == E here)."""
    routers = {}
    for l, perm in enumerate(perms):
        w = torch.zeros(E, E)
        w[perm, torch.arange(E)] = scale
        routers[l] = nn.Linear(E, E, bias=False)
        routers[l].weight.data = w
    return routers


def test_pregating_prefetches_the_next_layers_experts():
    perms = [[0, 1, 2, 3, 4, 5], [4, 2, 0, 5, 1, 3], [1, 0, 3, 2, 5, 4]]
    c = make_cache(slots=2, top_k=1, prefetch=1, routers=permutation_routers(perms), hidden=E)
    x = torch.eye(E)[[0, 3]]  # tokens e_0 and e_3
    run_ids(c, 0, [[0], [3]], x)
    assert c.predicted[1] == {4, 5} and set(c.resident[1]) == {4, 5}  # copied before layer 1 runs
    assert c.predicted[2] is None and not c.resident[2]  # one layer ahead only
    run_ids(c, 1, [[4], [5]], x)  # the prediction was right: two hits
    s = c.stats()
    assert (s["expert_hits"], s["expert_misses"], s["expert_prefetch_useful"]) == (2, 2, 2)
    assert s["expert_prefetch_precision"] == s["expert_prefetch_recall"] == 1.0
    assert c.predicted[2] == {1, 2}
    run_ids(c, 2, [[1], [4]], x)  # half right
    s = c.stats()
    assert s["expert_prefetch_precision"] == s["expert_prefetch_recall"] == pytest.approx(3 / 4)
    assert s["expert_prefetch_copies"] == 4 and s["expert_prefetch_useful"] == 3
    assert s["expert_bytes_prefetched"] == 4 * c.store.expert_bytes

    deep = make_cache(slots=2, top_k=1, prefetch=2, routers=permutation_routers(perms), hidden=E)
    run_ids(deep, 0, [[0], [3]], x)  # two layers ahead (the CPU link always has room)
    assert deep.predicted[1] == {4, 5} and deep.predicted[2] == {1, 2}
    assert set(deep.resident[2]) == {1, 2}


def test_prediction_is_capped_at_the_layers_slots():
    c = make_cache(slots=2, top_k=2, prefetch=1)
    run_ids(c, 0, [[0, 1], [2, 3], [4, 5]])
    assert len(c.predicted[1]) == 2 and set(c.resident[1]) == c.predicted[1]


# ---- outputs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("slots", [1, 3, None])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_torch_path_equals_resident_experts_exactly(slots, prefetch):
    c = make_cache(slots=slots, prefetch=prefetch)
    for step in range(4):
        for layer in range(3):
            T = 1 + 3 * step
            x = torch.randn(T, H, generator=torch.Generator().manual_seed(step * 10 + layer))
            weights, ids = route(T, 2, seed=step * 10 + layer)
            assert torch.equal(c.run(layer, x, weights, ids), resident_output(c, layer, x, weights, ids))
    s = c.stats()
    if slots is None:
        assert s["expert_hit_rate"] == 1.0 and s["expert_bytes_streamed"] == 0
    else:
        assert s["expert_misses"] > 0 and s["expert_bytes_on_demand"] > 0
        assert all(len(r) <= slots for r in c.resident)


@pytest.mark.parametrize("slots", [2, None])
def test_triton_path_in_passes(slots):
    """The fused kernel reading through the slot table: a step needing more experts than the
    layer's slots runs in passes (slots refilled between them); all resident, one fixed table.
    (On a GPU this runs the copy stream and its events.)"""
    c = make_cache(slots=slots, prefetch=1, kernel="triton", device=DEVICE)
    for step, T in enumerate((1, 5, 1, 5)):
        for layer in range(3):
            x = torch.randn(T, H, generator=torch.Generator().manual_seed(step * 10 + layer))
            weights, ids = route(T, 2, seed=step * 10 + layer)
            out = c.run(layer, x.to(DEVICE), weights.to(DEVICE), ids.to(DEVICE)).cpu()
            torch.testing.assert_close(out, resident_output(c, layer, x, weights, ids), atol=1e-5, rtol=1e-5)
    if slots is not None:
        assert c.stats()["expert_misses"] > 0


# ---- whole models -----------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def shared_tokenizer():
    """Every engine here uses the default tokenizer: load it once."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Tokenizer, "load", functools.lru_cache(maxsize=None)(Tokenizer.load))
        yield


COMMON = dict(vocab_size=49152, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256)
FAMILIES = {
    # safetensors written by transformers (the loader moves experts to the store before placing the model)
    "mixtral": ("safetensors", lambda: transformers.MixtralConfig(**COMMON, intermediate_size=48,
                                                                  num_local_experts=4, num_experts_per_tok=2)),
    # dummy weights from a config.json (the loader moves the initialised experts to the store)
    "qwen3_moe": ("dummy", lambda: transformers.Qwen3MoeConfig(**COMMON, head_dim=32, moe_intermediate_size=32,
                                                               num_experts=8, num_experts_per_tok=2,
                                                               norm_topk_prob=True)),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    load_format, make_config = FAMILIES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    if load_format == "dummy":
        make_config().save_pretrained(folder)
    else:
        torch.manual_seed(0)
        ref = transformers.AutoModelForCausalLM.from_config(make_config())
        with torch.no_grad():  # widen the tiny random init so routing is not trivial
            for name, p in ref.named_parameters():
                if "norm" not in name:
                    p.normal_(0, 0.2)
        ref.save_pretrained(folder)
    args = dict(model=str(folder), load_format="auto" if load_format == "safetensors" else "dummy",
                tokenizer="default", kv_format="fp16", max_num_seqs=4)
    resident = LLMEngine(EngineArgs(**args))
    return request.param, args, resident


PROMPTS = [[7, 300, 4000, 123, 9], list(range(1000, 1040)), [42] * 3]


def generate(engine, max_tokens=10):
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    ids = [engine.add_request(None, SamplingParams(**vars(params)), prompt_ids=p) for p in PROMPTS]
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    return [done[i] for i in ids]


def test_tiny_expert_budget_gives_the_same_tokens(family):
    name, args, resident = family
    expected = generate(resident)
    cfg = resident.cfg
    one_per_layer = expert_nbytes(cfg.hidden_size, cfg.moe_intermediate_size, torch.float32) * len(cfg.moe_layers)
    policy = "lfu" if name == "mixtral" else "lru"
    streamed = LLMEngine(EngineArgs(**args, expert_budget_bytes=one_per_layer, expert_prefetch=2,
                                    expert_policy=policy))
    cache = streamed.model.expert_cache
    assert cache.slots_per_layer == 1 and not hasattr(streamed.model.layers[0].mlp, "w13")
    assert generate(streamed) == expected
    stats = streamed.stats()
    assert stats["expert_misses"] > 0 and stats["expert_bytes_per_token"] > 0
    assert stats["expert_prefetch_copies"] > 0 and 0 <= stats["expert_prefetch_recall"] <= 1
    assert stats["expert_policy"] == policy and stats["kv_blocks_used"] == 0


def test_bench_experts_smoke(tmp_path):
    """benchmarks/bench_experts.py --smoke: the GPU benchmark's code paths on tiny CPU shapes."""
    spec = importlib.util.spec_from_file_location("bench_experts", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    assert bench.main(["--smoke", "--steps", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["models"]["smoke"]["rows"]
    assert len(rows) == 9 and all("error" not in r for r in rows)
    assert all(r["exact_vs_resident"] for r in rows)  # streamed outputs equal the all-resident ones
    assert {(r["budget"], r["batch"]) for r in rows} >= {(f, b) for f in (0.25, 0.5, 1.0) for b in (1, 8)}
