"""alrkvd-eval (backend/evaluate.py): perplexity through the engine's real paged cache, memory accounting
of the result, chunking invariance for the exact format, passkey prompts, and the CLI's JSON."""
from __future__ import annotations

import argparse
import json
import math
import os

import pytest
import torch

from backend import evaluate
from backend.kv_formats import make_format

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WIKITEXT = os.path.join(REPO, "data", "wikitext-2-raw", "wiki.test.raw")


def test_wikitext_copy_is_there_with_attribution():
    if not os.path.exists(WIKITEXT):
        pytest.fail(f"missing {WIKITEXT}: the quality benchmark reads WikiText-2 from data/wikitext-2-raw/")
    assert os.path.getsize(WIKITEXT) == 1290547
    readme = open(os.path.join(os.path.dirname(WIKITEXT), "README.md")).read()
    assert "CC BY-SA" in readme and "Merity" in readme
    assert evaluate.DEFAULT_TEXT == WIKITEXT


def test_parse_kv_opts():
    assert evaluate.parse_kv_opts(["k_bits=3", "codebook = gauss", "x=a=b"]) == \
        {"k_bits": "3", "codebook": "gauss", "x": "a=b"}
    with pytest.raises(SystemExit):
        evaluate.parse_kv_opts(["novalue"])


def test_memoized_decode_is_identical_and_invalidated_on_encode():
    fmt = make_format("alrkvd", 2, 3, 64, torch.float32, "cpu", 4, rank_budget="8", latent_bits="4")
    raw = make_format("alrkvd", 2, 3, 64, torch.float32, "cpu", 4, rank_budget="8", latent_bits="4")
    evaluate.memoize_decode(fmt)
    g = torch.Generator().manual_seed(0)
    for b in range(3):
        k, v = torch.randn(128, 3, 64, generator=g), torch.randn(128, 3, 64, generator=g)
        fmt.encode(1, b, k, v)
        raw.encode(1, b, k, v)
    for ids in ([0, 1, 2], [2, 0], [], [1]):
        a, b = fmt.decode(1, ids), raw.decode(1, ids)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    k, v = torch.randn(128, 3, 64, generator=g), torch.randn(128, 3, 64, generator=g)
    fmt.encode(1, 1, k, v)                      # a block id reused after being freed: fresh content
    raw.encode(1, 1, k, v)
    assert torch.equal(fmt.decode(1, [1])[0], raw.decode(1, [1])[0])



def test_memoized_decode_takes_each_blocks_position():
    """Blocks of several sequences decoded together (a batched decode step) come with each block's first position;
    for keys stored after RoPE the memo decodes each at its own, as the format does."""
    from backend.config import ModelConfig
    from backend.model import Rotary
    cfg = ModelConfig(model_type="llama", vocab_size=10, hidden_size=384, num_layers=2, num_heads=6, num_kv_heads=3,
                      head_dim=64, intermediate_size=8, rope_theta=10000.0)
    fmt, raw = (make_format("alrkvd", 2, 3, 64, torch.float32, "cpu", 4, rank_budget="8", key_frame="rotated")
                for _ in range(2))
    for f in (fmt, raw):
        f.set_rotary(Rotary(cfg, 1024, "cpu"))
    evaluate.memoize_decode(fmt)
    g = torch.Generator().manual_seed(0)
    starts = [0, 128, 0]  # two blocks of one sequence, the first block of another
    for b, start in enumerate(starts):
        k, v = torch.randn(128, 3, 64, generator=g), torch.randn(128, 3, 64, generator=g)
        fmt.encode(1, b, k, v, start_pos=start)
        raw.encode(1, b, k, v, start_pos=start)
    a, b = (f.decode(1, [0, 1, 2], start_pos=torch.tensor(starts)) for f in (fmt, raw))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])

@pytest.fixture(scope="module")
def engine():
    args = argparse.Namespace(model="default", device="cpu", dtype="auto", chunk=64)
    eng = evaluate.load_engine(args)
    ids = evaluate.load_text_ids(eng, WIKITEXT, 512)
    return eng, ids


def test_passkey_prompt(engine):
    eng, _ = engine
    ids = evaluate.passkey_prompt(eng.tokenizer, 1024, 0.5, "48213")
    assert 900 <= len(ids) <= 1024
    text = eng.tokenizer.decode(ids)
    assert "48213" in text and text.rstrip().endswith("The pass key is")
    assert text.index("48213") > len(text) // 4


def test_the_harness_takes_a_preset_by_name(engine):
    # quality_sweep and quality_passkey name presets too; alrkvd-gpu-3.7x folds its value rotation into the model
    eng, _ = engine
    evaluate.set_cache(eng, "alrkvd-gpu-3.7x", {"rank_budget": "16"}, 256)
    o = eng.cache.format.options
    assert (o["k_bits"], o["v_bits"], o["rank_budget"]) == (4, 2, 16) and eng.model.value_rotation is not None
    evaluate.set_cache(eng, "full", {}, 256)
    assert eng.model.value_rotation is None


def test_perplexity_chunking_invariant_for_exact_format(engine):
    """'full' (the model dtype) is exact: feeding a window in chunks through the cache gives the same logits
    as feeding it at once."""
    eng, ids = engine
    evaluate.set_cache(eng, "full", {}, 256)
    a = evaluate.perplexity(eng, ids[:256], 256, 256)
    b = evaluate.perplexity(eng, ids[:256], 256, 64)
    assert a["tokens"] == b["tokens"] == 255
    assert a["ppl"] == pytest.approx(b["ppl"], rel=1e-4)


def test_perplexity_through_compressed_cache(engine):
    eng, ids = engine
    res = {}
    for kv, opts in (("full", {}), ("fp16", {}), ("kivi2", {}), ("kivi4", {}),
                     ("alrkvd", {"rank_budget": "24", "key_weight": "4", "latent_bits": "4", "scale_bits": "8"})):
        evaluate.set_cache(eng, kv, opts, 512)
        r = evaluate.perplexity(eng, ids, 512, 128)
        assert r["tokens"] == 511 and r["windows"] == 1 and math.isfinite(r["ppl"])
        # bytes: 4 closed blocks (+ the window slot for windowed formats) over 512 tokens
        cache = eng.cache
        blocks = 512 // cache.block_size
        expect = (blocks * cache.block_bytes + (cache.slot_bytes if cache.windowed else 0)) / 512
        assert r["kv_bytes_per_token"] == pytest.approx(expect)
        assert r["baseline_bytes_per_token"] == 2 * 30 * 3 * 64 * 2
        assert r["compression"] == pytest.approx(r["baseline_bytes_per_token"] / r["kv_bytes_per_token"])
        res[kv] = r
    assert res["fp16"]["compression"] == pytest.approx(1.0)           # 16-bit storage even for the fp32 CPU model
    # compressed past blocks cost perplexity, more bits cost less
    assert res["fp16"]["ppl"] <= res["kivi4"]["ppl"] * 1.01
    assert res["kivi4"]["ppl"] < res["kivi2"]["ppl"]
    assert res["alrkvd"]["ppl"] < res["kivi2"]["ppl"]
    assert res["alrkvd"]["kv_block_bytes_per_token"] < res["kivi2"]["kv_block_bytes_per_token"]


def test_memoized_evaluation_equals_plain_over_windows(engine):
    """The second window reuses the block ids the first one freed: the harness's memoized decode gives the
    perplexity the format's own decode gives."""
    eng, ids = engine
    opts = {"block_size": 64, "rank_budget": "8", "latent_bits": "4"}
    evaluate.set_cache(eng, "alrkvd", opts, 256)
    memoized = evaluate.perplexity(eng, ids, 256, 64)
    evaluate.set_cache(eng, "alrkvd", opts, 256)
    del eng.cache.format.encode, eng.cache.format.decode, eng.cache.format.decode_layers  # the format's own methods
    plain = evaluate.perplexity(eng, ids, 256, 64)
    assert memoized["windows"] == plain["windows"] == 2
    assert memoized["ppl"] == pytest.approx(plain["ppl"], rel=1e-6)


def test_cli_json(capsys):
    rc = evaluate.main(["perplexity", "--kv", "kivi4", "--context", "256", "--max-tokens", "300",
                        "--chunk", "128", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("ppl", "tokens", "kv_bytes_per_token", "baseline_bytes_per_token", "compression"):
        assert key in out
    assert out["tokens"] == 255 + 43 and out["windows"] == 2 and out["kv"] == "kivi4"
    assert out["kv_options"]["block_size"] == 128


def test_key_found_needs_the_whole_number():
    assert evaluate.key_found("60494", " 60494. Remember")
    assert evaluate.key_found("60494", "is 60494")
    assert not evaluate.key_found("60494", " 604949.")
    assert not evaluate.key_found("60494", " 160494")
    assert not evaluate.key_found("60494", " 1234567")


def test_memoized_decode_keeps_positions_for_post_rope():
    from backend.config import ModelConfig
    from backend.model import Rotary
    cfg = ModelConfig(model_type="llama", vocab_size=10, hidden_size=384, num_layers=2, num_heads=6,
                      num_kv_heads=3, head_dim=64, intermediate_size=8, rope_theta=10000.0)
    rot = Rotary(cfg, 2048, "cpu")
    opts = dict(key_frame="post_rope", rank_budget="8", latent_bits="4")
    fmt = make_format("alrkvd", 2, 3, 64, torch.float32, "cpu", 4, **opts)
    raw = make_format("alrkvd", 2, 3, 64, torch.float32, "cpu", 4, **opts)
    fmt.set_rotary(rot)
    raw.set_rotary(rot)
    evaluate.memoize_decode(fmt)
    g = torch.Generator().manual_seed(0)
    table = [3, 0, 2]                              # block ids of one sequence, in order
    for i, b in enumerate(table):
        k, v = torch.randn(128, 3, 64, generator=g), torch.randn(128, 3, 64, generator=g)
        fmt.encode(0, b, k, v, start_pos=i * 128)
        raw.encode(0, b, k, v, start_pos=i * 128)
    fmt.decode(0, table[:1])                       # memoize the first block alone, then all
    a, b = fmt.decode(0, table), raw.decode(0, table)
    assert torch.allclose(a[0], b[0], atol=1e-6) and torch.equal(a[1], b[1])


def test_quality_sweep_picks_up_configs_appended_while_it_runs(tmp_path, monkeypatch):
    """benchmarks/quality_sweep.py re-reads --configs-file before each configuration (one run, one model),
    skips what --out already holds, and measures each configuration once."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("quality_sweep", os.path.join(REPO, "benchmarks", "quality_sweep.py"))
    qs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(qs)
    cfg, out = tmp_path / "configs", tmp_path / "out.jsonl"
    cfg.write_text("# comment\nfp16\nkivi2 group=32\n")
    measured = []

    class Eng:
        pass

    def fake_perplexity(eng, ids, context, chunk):
        measured.append(eng.kv)
        if len(measured) == 1:                                # appended while the first one runs
            with open(cfg, "a") as f:
                f.write("alrkvd k_bits=3\n")
        return {"ppl": 1.0, "kv_bytes_per_token": 1.0, "compression": 1.0, "compression_16bit_window": 1.0,
                "compression_blocks": 1.0}

    def fake_set_cache(eng, kv, opts, context):
        eng.kv = (kv, opts)

    monkeypatch.setattr(qs, "load_engine", lambda a: Eng())
    monkeypatch.setattr(qs, "load_text_ids", lambda eng, path, n: list(range(10)))
    monkeypatch.setattr(qs, "set_cache", fake_set_cache)
    monkeypatch.setattr(qs, "perplexity", fake_perplexity)
    assert qs.main(["--configs-file", str(cfg), "--out", str(out)]) == 0
    assert measured == [("fp16", {}), ("kivi2", {"group": "32"}), ("alrkvd", {"k_bits": "3"})]
    assert [json.loads(ln)["config"] for ln in out.read_text().splitlines()] == ["fp16", "kivi2 group=32",
                                                                                  "alrkvd k_bits=3"]
    measured.clear()
    assert qs.main(["--configs-file", str(cfg), "--out", str(out)]) == 0      # all done: nothing re-measured
    assert measured == []
