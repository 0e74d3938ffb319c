"""The SmolLM2 MoE (backend/moefy.py): a deterministic build, transformers' logits, the intended sum of experts."""
from kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()

import asyncio  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402

from backend import moefy  # noqa: E402
from backend.engine import AsyncEngine, EngineArgs, LLMEngine, SamplingParams  # noqa: E402
from backend.loader import load_model, read_gguf  # noqa: E402
from backend.tokenizer import default_model_path  # noqa: E402

ATOL_FP32 = 2e-3  # as tests/engine/test_engine.py: float32 on both sides, only summation order differs


@pytest.fixture(scope="module")
def folder():
    return moefy.model_path()  # built by `make setup`; built here if not


@pytest.fixture(scope="module")
def split():
    with safe_open(moefy.SPLIT_FILE, "pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}


def test_build_is_deterministic(folder, split, tmp_path):
    meta, _ = split
    assert moefy.checksum(folder) == meta["checksum"]
    assert moefy.build(str(tmp_path / "again")) == meta["checksum"]  # raises on any other checksum


def test_logits_match_transformers(folder, split):
    meta, _ = split
    E, k = int(meta["num_experts"]), int(meta["top_k"])
    engine = LLMEngine(EngineArgs(model=moefy.NAME, kv_format="full", max_num_seqs=1))
    assert engine.cfg.model_type == "qwen2_moe" and engine.cfg.num_experts == E
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = engine.tokenizer.encode("The capital of France is Paris. In 1905, Albert Einstein published four papers "
                                  "that changed physics. def fibonacci(n):\n    return n if n < 2 else" * 2)
    ours = engine.score(ids, chunk_size=37)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(ours, ref, atol=ATOL_FP32, rtol=0)
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() > 0.99
    counts = engine.routing_counts()  # what /metrics reports: every token's k experts, in every layer
    assert counts.shape == (30, E) and (counts.sum(1) == len(ids) * k).all()


def test_served_routing_counts_are_published_by_the_engine_thread(folder, split):
    """Other threads (the metrics') read the counts the engine thread copied to the host, never the device's own:
    they catch up with the engine's once it idles, and later steps do not change a copy already read."""
    meta, _ = split
    k = int(meta["top_k"])
    served = AsyncEngine(EngineArgs(model=moefy.NAME, kv_format="full", max_num_seqs=2))

    async def run(request_id):
        async for out in served.generate("Route me through the experts", SamplingParams(max_tokens=4, temperature=0),
                                         request_id):
            pass
        return out

    try:
        assert served.routing_counts().sum() == 0
        out = asyncio.run(run("a"))
        deadline = time.monotonic() + 10
        while not torch.equal(served.routing_counts(), served.engine.routing_counts()) and time.monotonic() < deadline:
            time.sleep(0.05)
        read = served.routing_counts()
        assert torch.equal(read, served.engine.routing_counts())
        tokens = out.num_prompt_tokens + out.num_output_tokens - 1  # the last token drawn, never fed back
        assert (read.sum(1) == tokens * k).all()
        asyncio.run(run("b"))
        assert (read.sum(1) == tokens * k).all()  # a copy: the next request's routing is not in it
    finally:
        served.shutdown()


def test_moe_layer_is_the_sum_of_the_chosen_neurons(folder, split):
    """A layer of the built model equals the dense FFN restricted to the shared neurons and the neurons of
    the k experts its (unscaled) router ranks highest: the routing weights reproduce a plain sum (within the
    1% that moefy.LOGIT_SPREAD allows the softmax weights)."""
    meta, tensors = split
    shared, E, k = int(meta["shared_neurons"]), int(meta["num_experts"]), int(meta["top_k"])
    _, dense = read_gguf(default_model_path())
    moe = load_model(folder)
    torch.manual_seed(0)
    for i in (0, 17, 29):
        x = torch.randn(64, moe.cfg.hidden_size)
        perm, router = tensors[f"layers.{i}.perm"].long(), tensors[f"layers.{i}.router"].float()
        n = (len(perm) - shared) // E
        chosen = (x @ router.T).topk(k, dim=-1).indices                       # [T, k]
        keep = torch.zeros(len(x), len(perm))
        keep[:, perm[:shared]] = 1
        expert_neurons = perm[shared:].view(E, n)
        for t in range(len(x)):
            keep[t, expert_neurons[chosen[t]].flatten()] = 1
        gate, up, down = moefy.tuned_ffn(dense, tensors, i)  # the dense FFN with the split's corrections
        ref = (F.silu(x @ gate.T) * (x @ up.T) * keep) @ down.T
        with torch.no_grad():
            ours = moe.layers[i].mlp(x)
        assert ((ours - ref).norm() / ref.norm()).item() < 1e-2


def test_low_rank_corrections_are_exact_products_of_their_int8_factors():
    """`tune`'s factors: int8 codes with power-of-two scales, B per row and A per column, so the correction the
    build adds is the exact product rounded once to float32, whatever the machine sums first."""
    g = torch.Generator().manual_seed(0)
    b, a = torch.randn(96, 16, generator=g) * 1e-3, torch.randn(16, 40, generator=g) * 0.1
    qb, qa = moefy.quantize_factor(b, 1), moefy.quantize_factor(a, 0)
    assert qb[0].dtype == qa[0].dtype == torch.int8 and qb[1].shape == (96,) and qa[1].shape == (40,)
    b_hat, a_hat = moefy.dequantize_factor(*qb, 1), moefy.dequantize_factor(*qa, 0)
    assert ((b_hat - b.double()).abs() <= b.abs().amax(1, keepdim=True).double() / 127).all()  # a step of its row
    exact = torch.tensor([[sum(x * y for x, y in zip(row, col)) for col in a_hat.T.tolist()]
                          for row in b_hat.tolist()], dtype=torch.float64)  # Python's sums, in order
    assert torch.equal(moefy.low_rank_delta(*qb, *qa), exact.float())
    for q, dequantized, dim in ((qb, b_hat, 1), (qa, a_hat, 0)):  # `tune --resume` starts from the dequantized
        again = moefy.quantize_factor(dequantized.float(), dim)       # factors: quantized again, the same codes
        assert torch.equal(again[0], q[0]) and torch.equal(again[1], q[1])


def test_a_missing_or_unsupported_model_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no .gguf file and no folder with a config.json"):
        load_model(str(tmp_path / "nowhere"))
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "num_attention_heads": 12, "hidden_size": 768,'
                                          ' "num_hidden_layers": 12, "vocab_size": 50257}')
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        load_model(str(tmp_path))
    assert os.path.isfile(moefy.SPLIT_FILE)
