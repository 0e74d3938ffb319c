"""backend/tokenizer.py against transformers' own GGUF tokenizer for SmolLM2 (the reference, tests only)."""

import json
import os
import random

import pytest

from backend.tokenizer import IncrementalDetokenizer, Tokenizer, _bytes_to_unicode, default_model_path

WIKITEXT = "/work/shared/data/wikitext-2-raw/wiki.test.raw"

TEXTS = [
    "Hello world",
    "",
    " ",
    "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1e-9 0x1F 1,000,000 2024-05-17",
    # Whitespace runs before digits: SmolLM2's tokenizer.json and llama.cpp split these differently.
    "  1", "x =  12", "\t\t3", "a\n\n  42", "½ ² ³ ٣٤ 一二三",
    "Unicode: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어, עברית, العربية",
    "Emoji: 🦙🚀👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "def f(x):\n    return {'a': [x ** 2 for x in range(10)]}  # comment\n\tif x != y: pass\n",
    "   leading and trailing   ",
    "multiple\n\n\nnewlines\r\nand\ttabs\t\t and   spaces    ",
    "don't I'll we've they're she'd it's 'quoted' \"double\"",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|im_start|><|im_end|> <repo_name> x<file_sep>y",
    "<|im_start <|im_end | not quite special tokens",
    "URL: https://example.com/path?q=1&r=2#frag, email: a.b@c.de",
    "\u200b zero width, \u00a0nbsp, \ufeffbom, \u2028line sep",
]
# Bytes missing from SmolLM2's vocabulary (\x04, the F1 lead byte...) are dropped, by transformers too: no round trip.
LOSSY = "a\x04b\x13\x14c x\U00050000y"


@pytest.fixture(scope="module")
def ref():
    from transformers import AutoTokenizer

    path = default_model_path()
    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.load("default")


@pytest.fixture(scope="module")
def wiki_lines():
    with open(WIKITEXT, encoding="utf-8", newline="") as f:  # keep its \r\n line ends
        return f.read().splitlines(keepends=True)[:200]


def test_metadata(tok):
    assert os.path.isfile(default_model_path())
    assert tok.vocab_size == 49152
    assert tok.bos_token_id == 1 and tok.eos_token_id == 2
    assert tok.decode([tok.eos_token_id]) == "<|im_end|>"
    assert tok.stop_token_ids == [2]
    assert tok.max_model_len == 8192


@pytest.mark.parametrize("text", TEXTS + [LOSSY])
def test_encode_matches_transformers(tok, ref, text):
    for add_special_tokens in (True, False):
        assert tok.encode(text, add_special_tokens) == ref.encode(text, add_special_tokens=add_special_tokens)


def test_encode_wikitext_matches_transformers(tok, ref, wiki_lines):
    for line in wiki_lines:
        assert tok.encode(line) == ref.encode(line), line
    text = "".join(wiki_lines)
    assert tok.encode(text) == ref.encode(text)


def test_decode_round_trip(tok, ref, wiki_lines):
    for text in TEXTS + ["".join(wiki_lines)]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text == ref.decode(ids)
        assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)


CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello. How can I help?"},
     {"role": "user", "content": "Tell me a joke about 🦙."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}],
]


@pytest.mark.parametrize("messages", CHATS)
def test_chat_template_matches_transformers(tok, ref, messages):
    for add_generation_prompt in (True, False):
        want = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        assert tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == want
    assert tok.encode(tok.apply_chat_template(messages), add_special_tokens=False) == ref.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True)["input_ids"]


def stream(detok, ids):
    return [detok.step(i) for i in ids]


def test_incremental_detokenizer_equals_decode(tok, wiki_lines):
    text = "".join(wiki_lines[:40]) + "".join(TEXTS)
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok)
    deltas = stream(detok, ids)
    assert "".join(deltas) == detok.text == tok.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)
    assert detok.flush() == ""


def test_incremental_detokenizer_after_prompt(tok):
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Say hi"}]))
    generated = tok.encode(" Hi there!  Ça va? 日本 🦙 <|im_end|>")
    detok = IncrementalDetokenizer(tok, prompt)
    assert "".join(stream(detok, generated)) == tok.decode(generated)
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=True)
    assert "".join(stream(detok, generated)) == tok.decode(generated, skip_special_tokens=True)


def test_incremental_detokenizer_holds_split_characters(tok):
    ids = tok.encode("a🦙b")
    assert len(ids) > 3, "the llama emoji should be split across byte tokens"
    detok = IncrementalDetokenizer(tok)
    deltas = stream(detok, ids)
    assert "" in deltas and "🦙" in deltas  # held back until its last byte, then emitted whole
    assert "".join(deltas) == "a🦙b"
    # A stream that stops mid-character emits the rest (U+FFFD) on flush, still equal to decode.
    cut = ids[:2]
    detok = IncrementalDetokenizer(tok)
    assert "".join(stream(detok, cut)) == "a"
    assert detok.flush() == tok.decode(cut)[1:] and detok.text == tok.decode(cut)


def test_incremental_detokenizer_random_bytes(tok):
    # Sampled tokens need not form valid UTF-8: mostly lone high-byte tokens, some whole words.
    rng = random.Random(0)
    byte_ids = [tok.tokenizer.token_to_id(c) for b, c in _bytes_to_unicode().items() if b >= 0x80]
    byte_ids = [i for i in byte_ids if i is not None]  # SmolLM2 lacks a few bytes (0xC0, 0xF5..0xFF, ...)
    prompt = tok.encode("A prompt 🦙")
    for _ in range(300):
        ids = [rng.choice(byte_ids) if rng.random() < 0.7 else rng.randrange(tok.vocab_size) for _ in range(20)]
        detok = IncrementalDetokenizer(tok, prompt)
        assert "".join(stream(detok, ids)) + detok.flush() == tok.decode(ids)


def test_from_pretrained_folder(tok, ref, tmp_path, wiki_lines):
    ref.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192, "eos_token_id": 2}))
    folder = Tokenizer.load(str(tmp_path))
    for text in TEXTS + wiki_lines[:50]:
        assert folder.encode(text) == ref.encode(text)
    ids = folder.encode(TEXTS[6])
    assert folder.decode(ids) == ref.decode(ids)
    assert folder.apply_chat_template(CHATS[1]) == tok.apply_chat_template(CHATS[1])
    assert (folder.bos_token_id, folder.eos_token_id, folder.vocab_size) == (1, 2, 49152)
    assert folder.stop_token_ids == [2, 0]
    assert folder.max_model_len == 8192


def test_load_rejects_unknown_source(tmp_path):
    with pytest.raises(FileNotFoundError):
        Tokenizer.load(str(tmp_path / "missing.gguf"))
