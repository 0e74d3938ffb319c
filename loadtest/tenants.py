"""Tenants of a load test, read from YAML, and their seeded prompt streams.

    seed: 1234
    defaults: {model: smollm2, protocol: grpc, sampling: {temperature: 0}}
    tenants:
      - name: chat
        weight: 3                 # share of the users (Locust weight); or fixed_count: 2
        protocol: grpc            # grpc (bidirectional stream) | http (SSE on generate_stream) | openai (SSE on the
                                  # OpenAI front's /v1/completions)
        model: smollm2
        prompt:
          source: synthetic       # synthetic | file | document | conversation
          words: {dist: uniform, min: 16, max: 48}    # or an int; synthetic, document and conversation prompts
          prefix: "Answer briefly: "
          # key: shared            # tenants with the same key get the same prompt sequence (A/B runs)
          # path: prompts.jsonl   # source: file; .jsonl ({"prompt"|"text": ...}) or .txt (one per line)
        max_tokens: 16            # or a distribution, like words
        sampling: {temperature: 0}
        slo: {ttft_ms: 2000, tpot_ms: 200}   # e2e_ms too; goodput = share of requests within all of them
        think_time_s: 0           # pause between a user's requests: seconds, or [min, max] (closed-loop shapes)
        cancel: {share: 0.2, after_tokens: {dist: uniform, min: 1, max: 8}}  # drop this share of the streams
                                  # after that many tokens (at most max_tokens - 1)
        invalid: [unknown_parameter, empty_prompt]   # every request is a bad one, of these kinds in turn

Prompt number k of a tenant is a pure function of (seed, tenant name, k), so the prompts a run sends
are reproducible from its seed whatever the timing; so are which requests are cancelled, when, and
which bad request k is (`invalid` kinds in turn: INVALID_KINDS, made by `make_invalid`). Lengths are in
words (the load generator has no tokenizer); the server's own `num_input_tokens` is recorded with every
request.

Long-context tenants read real text (`path`, default the repository's WikiText-2 test set; seeded windows of
it, the text repeated past its end with its paragraphs in another seeded order):
- `document`: question answering over a document of `words` words, then a short question.
  With `turns` n, a session asks n questions about one document (the questions in turn): prompt k is question
  k % n about document k // n, so a session's prompts share the document as their prefix;
- `conversation`: multi-turn chat whose history grows: `turns` turns a session, each adding a user message and
  an assistant reply of about `words` words each; prompt k is turn k % turns of session k // turns (its history
  and the new message, as plain text), so a session's prompts grow by two messages a turn. A Locust user continues
  its own session, each turn sent after the last one's answer (`users.LLMUser.next_seq`).
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import yaml

PROTOCOLS = ("grpc", "http", "openai")

_TENANT_KEYS = {"name", "weight", "fixed_count", "model", "protocol", "prompt", "max_tokens", "sampling", "slo",
                "think_time_s", "cancel", "invalid"}
_PROMPT_KEYS = {"source", "words", "prefix", "path", "key", "turns"}
# the real text long-context tenants read by default (the repository's copy of WikiText-2 test, with its README)
CORPUS = Path(__file__).resolve().parents[1] / "data" / "wikitext-2-raw" / "wiki.test.raw"
QUESTIONS = ("What is the main subject of this document?", "Who is mentioned first in the document?",
             "In which year does the document's earliest event take place?", "Summarise the last paragraph.",
             "Which places does the document name?", "What happened at the end of the document?")
_SLO_KEYS = {"ttft_ms", "tpot_ms", "e2e_ms"}
_CANCEL_KEYS = {"share", "after_tokens"}

LONG_PROMPT_WORDS = 12000
# Bad requests a tenant can send (`invalid: [...]`), each refused by the server with INVALID_ARG
# (HTTP 400) before any output: what each changes in an otherwise ordinary request.
INVALID_KINDS = {
    "unknown_parameter": "sampling gets an unknown key (no_such_knob)",
    "max_tokens_over_limit": "max_tokens 100000, above any model's per-request limit",
    "negative_temperature": "temperature -1",
    "wrong_type": "top_p is a word ('half')",
    "empty_prompt": "text_input is the empty string",
    "prompt_too_long": f"a prompt of {LONG_PROMPT_WORDS} words (~16k tokens): refused by the engine's door check, past "
                       "parsing, for a model of max_model_len below that (the CPU default: 2048)",
}


def make_invalid(kind: str, prompt: str, max_tokens: int, sampling: dict) -> tuple[str, int, dict]:
    """An ordinary request (prompt, max_tokens, sampling) turned into a bad one of `kind`."""
    sampling = dict(sampling)
    if kind == "unknown_parameter":
        sampling["no_such_knob"] = 1
    elif kind == "max_tokens_over_limit":
        max_tokens = 100000
    elif kind == "negative_temperature":
        sampling["temperature"] = -1.0
    elif kind == "wrong_type":
        sampling["top_p"] = "half"
    elif kind == "empty_prompt":
        prompt = ""
    elif kind == "prompt_too_long":
        words = prompt.split() or ["word"]
        prompt = " ".join(words[i % len(words)] for i in range(LONG_PROMPT_WORDS))
    else:
        raise ValueError(f"unknown invalid kind {kind!r} (one of {sorted(INVALID_KINDS)})")
    return prompt, max_tokens, sampling

# A plain vocabulary for synthetic prompts: ordinary words, so a BPE tokenizer sees ~1.2-1.4 tokens/word.
_VOCAB = """
the of and to in is that for it as was with be by on not he this are or his from at which but have an
they you were her she there been one all we their has would when if more will other its about into than
them can only some could time these two may first then do any like my now over such our man me even most
made after also did many before must through back years where much your way well down should because
each just those people how too little state good very make world still own see men work long here get both
between life being under never day same another know while last might great old year off come since against
go came right used take three small house water city system number part place case point group problem
fact hand high early young important few public large order government however small country river music
light garden morning evening mountain window story history science market report energy village station
question answer summary language computer network memory engine model server request token stream
""".split()


@dataclass(frozen=True)
class Dist:
    """An integer distribution: fixed | uniform(min, max) | normal(mean, std, clipped to min..max) | choice."""

    kind: str = "fixed"
    value: int = 0
    min: int = 1
    max: int = 1
    mean: float = 0.0
    std: float = 0.0
    values: tuple[int, ...] = ()

    @classmethod
    def parse(cls, spec, what: str) -> "Dist":
        if isinstance(spec, int) and not isinstance(spec, bool):
            return cls("fixed", value=spec)
        if not isinstance(spec, dict):
            raise ValueError(f"{what}: expected an int or a mapping with 'dist', got {spec!r}")
        kind = spec.get("dist", "fixed")
        allowed = {"fixed": {"value"}, "uniform": {"min", "max"}, "normal": {"mean", "std", "min", "max"},
                   "choice": {"values"}}
        if kind not in allowed:
            raise ValueError(f"{what}: unknown dist {kind!r} (one of {sorted(allowed)})")
        extra = set(spec) - allowed[kind] - {"dist"}
        if extra:
            raise ValueError(f"{what}: unknown key(s) {sorted(extra)} for dist {kind!r}")
        if kind == "fixed":
            return cls("fixed", value=int(spec["value"]))
        if kind == "uniform":
            lo, hi = int(spec["min"]), int(spec["max"])
            if not 0 <= lo <= hi:
                raise ValueError(f"{what}: need 0 <= min <= max, got {lo}, {hi}")
            return cls("uniform", min=lo, max=hi)
        if kind == "normal":
            mean, std = float(spec["mean"]), float(spec["std"])
            return cls("normal", mean=mean, std=std, min=int(spec.get("min", 1)),
                       max=int(spec.get("max", max(1, round(mean + 6 * std)))))
        values = tuple(int(v) for v in spec["values"])
        if not values:
            raise ValueError(f"{what}: choice needs values")
        return cls("choice", values=values)

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.value
        if self.kind == "uniform":
            return rng.randint(self.min, self.max)
        if self.kind == "normal":
            return int(min(self.max, max(self.min, round(rng.gauss(self.mean, self.std)))))
        return rng.choice(self.values)


@dataclass(frozen=True)
class PromptSource:
    source: str = "synthetic"
    words: Dist = Dist("uniform", min=16, max=48)
    prefix: str = ""
    path: str | None = None
    items: tuple[str, ...] = ()  # prompts loaded from `path`
    key: str | None = None  # names the prompt sequence (default: the tenant name)
    turns: int = 1  # conversation: turns a session; document: questions a document


@functools.lru_cache(maxsize=4)
def corpus_paragraphs(path: str) -> tuple[tuple[str, ...], ...]:
    """The text's paragraphs (non-empty lines, WikiText's " = Heading = " lines dropped) as word tuples."""
    with open(path, encoding="utf-8") as f:
        paragraphs = tuple(tuple(line.split()) for line in f if line.strip() and not line.strip().startswith("="))
    if not paragraphs:
        raise ValueError(f"{path} holds no text")
    return paragraphs


def corpus_words(path: str, n: int, rng: random.Random) -> str:
    """`n` words of real text from a seeded paragraph on, continuing through the text in a seeded order of its
    paragraphs (the variation when it must repeat)."""
    paragraphs = corpus_paragraphs(path)
    order = list(range(len(paragraphs)))
    rng.shuffle(order)
    start = rng.randrange(len(order))
    words: list[str] = []
    i = 0
    while len(words) < n:
        words += paragraphs[order[(start + i) % len(order)]]
        i += 1
    return " ".join(words[:n])


def _load_prompt_file(path: Path) -> tuple[str, ...]:
    if not path.is_file():
        raise ValueError(f"prompt file {path} does not exist")
    items = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if path.suffix == ".jsonl":
                obj = json.loads(line)
                text = obj.get("prompt", obj.get("text")) if isinstance(obj, dict) else obj
                if not isinstance(text, str):
                    raise ValueError(f"{path}:{n}: expected a string or an object with 'prompt' or 'text'")
                items.append(text)
            else:
                items.append(line)
    if not items:
        raise ValueError(f"prompt file {path} holds no prompts")
    return tuple(items)


@dataclass(frozen=True)
class Cancel:
    """The client drops `share` of a tenant's streams after `after_tokens` output tokens."""

    share: float = 1.0
    after_tokens: Dist = Dist("fixed", value=1)


@dataclass(frozen=True)
class Tenant:
    name: str
    model: str
    protocol: str = "grpc"
    weight: int = 1
    fixed_count: int = 0
    prompt: PromptSource = PromptSource()
    max_tokens: Dist = Dist("fixed", value=16)
    sampling: dict = field(default_factory=dict)
    slo: dict = field(default_factory=dict)
    think_time_s: tuple[float, float] = (0.0, 0.0)
    seed: int = 0
    cancel: Cancel | None = None
    invalid: tuple[str, ...] = ()  # INVALID_KINDS: every request is a bad one, these kinds in turn

    def request(self, k: int) -> tuple[str, int, int]:
        """Prompt number `k` of this tenant: (prompt text, max_tokens, prompt words). Deterministic."""
        p = self.prompt
        key = p.key or self.name
        rng = random.Random(f"{self.seed}/{key}/{k}")
        if p.source == "file":
            order = list(range(len(p.items)))
            random.Random(f"{self.seed}/{key}/order").shuffle(order)
            text = p.prefix + p.items[order[k % len(order)]]
        elif p.source == "document":  # with turns: question k % turns about document k // turns
            session, turn = divmod(k, p.turns)
            drng = rng if p.turns == 1 else random.Random(f"{self.seed}/{key}/document/{session}")  # whatever k
            document = corpus_words(p.path, max(1, p.words.sample(drng)), drng)
            question = (drng.choice(QUESTIONS) if p.turns == 1
                        else QUESTIONS[(drng.randrange(len(QUESTIONS)) + turn) % len(QUESTIONS)])
            text = f"{p.prefix}{document}\n\nQuestion: {question}\nAnswer briefly:"
        elif p.source == "conversation":
            session, turn = divmod(k, p.turns)
            srng = random.Random(f"{self.seed}/{key}/session/{session}")  # the session's history, whatever k
            lines = []
            for t in range(turn + 1):
                lines.append("User: " + corpus_words(p.path, max(1, p.words.sample(srng)), srng))
                reply = "Assistant: " + corpus_words(p.path, max(1, p.words.sample(srng)), srng)
                if t < turn:
                    lines.append(reply)
            text = p.prefix + "\n".join(lines) + "\nAssistant:"
        else:
            n = max(1, p.words.sample(rng))
            words = []
            for i in range(n):
                w = rng.choice(_VOCAB)
                words.append(w.capitalize() if i == 0 or words[-1].endswith(".") else w)
                if i % 12 == 11 and i != n - 1:
                    words[-1] += "."
            text = p.prefix + " ".join(words) + "."
        return text, max(1, self.max_tokens.sample(rng)), len(text.split())

    def cancel_after(self, k: int, max_tokens: int) -> int | None:
        """Output tokens after which the client drops request `k`'s stream; None: it reads to the end.
        At most max_tokens - 1, so the request is still running when the client leaves."""
        if self.cancel is None or self.invalid_kind(k) is not None or max_tokens < 2:
            return None
        rng = random.Random(f"{self.seed}/{self.prompt.key or self.name}/{k}/cancel")
        if rng.random() >= self.cancel.share:
            return None
        return min(max(1, self.cancel.after_tokens.sample(rng)), max_tokens - 1)

    def invalid_kind(self, k: int) -> str | None:
        """The kind of bad request that request `k` is (None: an ordinary one)."""
        return self.invalid[k % len(self.invalid)] if self.invalid else None


@dataclass(frozen=True)
class TenantsConfig:
    seed: int
    tenants: tuple[Tenant, ...]
    path: str | None = None

    def slos(self) -> dict[str, dict]:
        return {t.name: dict(t.slo) for t in self.tenants}

    def to_dict(self) -> dict:
        return {
            "seed": self.seed, "path": self.path,
            "tenants": [{"name": t.name, "model": t.model, "protocol": t.protocol, "weight": t.weight,
                         "fixed_count": t.fixed_count, "max_tokens": vars(t.max_tokens),
                         "prompt": {"source": t.prompt.source, "words": vars(t.prompt.words),
                                    "prefix": t.prompt.prefix, "path": t.prompt.path, "key": t.prompt.key,
                                    "turns": t.prompt.turns},
                         "sampling": t.sampling, "slo": t.slo, "think_time_s": list(t.think_time_s),
                         "cancel": {"share": t.cancel.share, "after_tokens": vars(t.cancel.after_tokens)}
                         if t.cancel else None, "invalid": list(t.invalid)}
                        for t in self.tenants],
        }


def parse_tenants(doc: dict, base_dir: Path | None = None, seed: int | None = None,
                  protocol: str | None = None, model: str | None = None) -> TenantsConfig:
    """Build tenants from a parsed YAML document. `seed`, `protocol`, `model` override the file."""
    if not isinstance(doc, dict) or not isinstance(doc.get("tenants"), list) or not doc["tenants"]:
        raise ValueError("tenants file needs a non-empty 'tenants' list")
    extra = set(doc) - {"seed", "defaults", "tenants"}
    if extra:
        raise ValueError(f"tenants file: unknown top-level key(s) {sorted(extra)}")
    base_dir = base_dir or Path.cwd()
    seed = int(doc.get("seed", 0)) if seed is None else int(seed)
    defaults = doc.get("defaults") or {}
    tenants, names = [], set()
    for i, raw in enumerate(doc["tenants"]):
        spec = {**defaults, **(raw or {})}
        what = f"tenant #{i} ({spec.get('name', '?')})"
        extra = set(spec) - _TENANT_KEYS
        if extra:
            raise ValueError(f"{what}: unknown key(s) {sorted(extra)}")
        name = str(spec.get("name", ""))
        if not name.isidentifier():
            raise ValueError(f"{what}: name must be an identifier (it names a Locust user class), got {name!r}")
        if name in names:
            raise ValueError(f"{what}: duplicate tenant name")
        names.add(name)
        proto = protocol or spec.get("protocol", "grpc")
        if proto not in PROTOCOLS:
            raise ValueError(f"{what}: protocol must be one of {PROTOCOLS}, got {proto!r}")
        if "weight" in (raw or {}) and "fixed_count" in (raw or {}):
            raise ValueError(f"{what}: give weight or fixed_count, not both")
        pspec = spec.get("prompt") or {}
        extra = set(pspec) - _PROMPT_KEYS
        if extra:
            raise ValueError(f"{what}: unknown prompt key(s) {sorted(extra)}")
        source = pspec.get("source", "synthetic")
        if source == "file":
            if not pspec.get("path"):
                raise ValueError(f"{what}: prompt source 'file' needs a path")
            ppath = Path(pspec["path"])
            ppath = ppath if ppath.is_absolute() else base_dir / ppath
            prompt = PromptSource("file", prefix=pspec.get("prefix", ""), path=str(ppath),
                                  items=_load_prompt_file(ppath), key=pspec.get("key"))
        elif source in ("synthetic", "document", "conversation"):
            words = Dist.parse(pspec.get("words", {"dist": "uniform", "min": 16, "max": 48}), f"{what} prompt.words")
            path = None
            if source != "synthetic":
                path = Path(pspec["path"]) if pspec.get("path") else CORPUS
                path = path if path.is_absolute() else base_dir / path
                try:
                    corpus_paragraphs(str(path))  # fails here, with the path, if it cannot be read
                except OSError as e:
                    raise ValueError(f"{what}: prompt text {path} cannot be read: {e.strerror}") from None
            turns = int(pspec.get("turns", 4 if source == "conversation" else 1))
            if turns < 1:
                raise ValueError(f"{what}: prompt.turns must be at least 1")
            prompt = PromptSource(source, words=words, prefix=pspec.get("prefix", ""), key=pspec.get("key"),
                                  path=None if path is None else str(path), turns=turns)
        else:
            raise ValueError(f"{what}: prompt source must be synthetic, file, document or conversation, "
                             f"got {source!r}")
        slo = dict(spec.get("slo") or {})
        extra = set(slo) - _SLO_KEYS
        if extra:
            raise ValueError(f"{what}: unknown slo key(s) {sorted(extra)} (use {sorted(_SLO_KEYS)})")
        sampling = dict(spec.get("sampling") or {})
        if "max_tokens" in sampling:
            raise ValueError(f"{what}: put max_tokens at the tenant level, not under sampling")
        think = spec.get("think_time_s", 0)
        think = (float(think), float(think)) if isinstance(think, (int, float)) else tuple(float(x) for x in think)
        if len(think) != 2 or not 0 <= think[0] <= think[1]:
            raise ValueError(f"{what}: think_time_s must be seconds or [min, max], got {spec.get('think_time_s')!r}")
        cancel = None
        if spec.get("cancel") is not None:
            cspec = spec["cancel"]
            if not isinstance(cspec, dict) or set(cspec) - _CANCEL_KEYS:
                raise ValueError(f"{what}: cancel must be a mapping with keys {sorted(_CANCEL_KEYS)}, got {cspec!r}")
            share = float(cspec.get("share", 1.0))
            if not 0 < share <= 1:
                raise ValueError(f"{what}: cancel share must be in (0, 1], got {share}")
            cancel = Cancel(share, Dist.parse(cspec.get("after_tokens", 1), f"{what} cancel.after_tokens"))
        invalid = spec.get("invalid") or ()
        invalid = (invalid,) if isinstance(invalid, str) else tuple(invalid)
        unknown = sorted(set(invalid) - set(INVALID_KINDS))
        if unknown:
            raise ValueError(f"{what}: unknown invalid kind(s) {unknown} (one of {sorted(INVALID_KINDS)})")
        m = model or spec.get("model")
        if not m:
            raise ValueError(f"{what}: no model (set it on the tenant or under defaults)")
        tenants.append(Tenant(
            name=name, model=str(m), protocol=proto,
            weight=int(spec.get("weight", 1)), fixed_count=int(spec.get("fixed_count", 0)),
            prompt=prompt, max_tokens=Dist.parse(spec.get("max_tokens", 16), f"{what} max_tokens"),
            sampling=sampling, slo=slo, think_time_s=think, seed=seed, cancel=cancel, invalid=invalid,
        ))
    return TenantsConfig(seed=seed, tenants=tuple(tenants))


def load_tenants(path: str | Path, **overrides) -> TenantsConfig:
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    cfg = parse_tenants(doc, base_dir=path.parent, **overrides)
    return TenantsConfig(cfg.seed, cfg.tenants, str(path))
