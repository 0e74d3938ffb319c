"""Probe: how much does the router cost? ppl on WikiText-2 test (first N tokens, windows of 2048) of the distilled
split with (a) its router, (b) an oracle choosing each token's k experts by their true output size (journal 2026-12-05 12b).

  .venv/bin/python benchmarks/results/moe_quality_cpu_2026-12-05/router_probe.py [SPLIT_FILE] [router,oracle]
"""
import math, os, sys, time, torch, torch.nn.functional as F
sys.path.insert(0, '.')
from safetensors import safe_open
from transformers import AutoModelForCausalLM
from backend import moefy
from backend.tokenizer import Tokenizer, default_model_path

split_file = sys.argv[1] if len(sys.argv) > 1 else moefy.SPLIT_FILE
modes = sys.argv[2].split(',') if len(sys.argv) > 2 else ['router', 'oracle']
N = int(os.environ.get('TOKENS', 4096))
torch.set_num_threads(int(os.environ.get('THREADS', 2)))
g = default_model_path()
model = AutoModelForCausalLM.from_pretrained(os.path.dirname(g), gguf_file=os.path.basename(g), dtype=torch.float32).eval()
with safe_open(split_file, 'pt') as f:
    meta = f.metadata(); split = {k: f.get_tensor(k) for k in f.keys()}
shared, E, k = int(meta['shared_neurons']), int(meta['num_experts']), int(meta['top_k'])
ffns = []
for i, layer in enumerate(model.model.layers):
    mlp = layer.mlp
    m = moefy.MaskedFFN(mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, split[f'layers.{i}.perm'],
                        split[f'layers.{i}.router'].float(), shared, E, k, int(meta.get('tune_rank', 1)))
    if 'tune_rank' in meta:
        with torch.no_grad():
            for p, b, a in zip(moefy.PROJECTIONS, m.b, m.a):
                b.copy_(moefy.dequantize_factor(split[f'layers.{i}.{p}.b'], split[f'layers.{i}.{p}.b_exp'], 1))
                a.copy_(moefy.dequantize_factor(split[f'layers.{i}.{p}.a'], split[f'layers.{i}.{p}.a_exp'], 0))
    layer.mlp = m; ffns.append(m)

def oracle_forward(self, x):
    gate, up, down = (w + b @ a for w, b, a in zip(self.weights, self.b, self.a))
    h = F.silu(x @ gate.T) * (x @ up.T)
    size = h.abs() * down.norm(dim=0)
    per_expert = torch.zeros(*x.shape[:-1], self.num_experts + 1).index_add_(-1, self.expert_of, size)[..., :-1]
    chosen = torch.zeros(*x.shape[:-1], self.num_experts + 1)
    chosen.scatter_(-1, per_expert.topk(self.top_k, dim=-1).indices, 1.0)
    chosen[..., -1] = 1.0
    return (h * chosen[..., self.expert_of]) @ down.T

text = open('data/wikitext-2-raw/wiki.test.raw', encoding='utf-8').read()
ids = torch.tensor(Tokenizer.load(g).encode(text, add_special_tokens=False)[:N])
for mode in modes:
    for m in ffns:
        m.forward = (lambda x, m=m: oracle_forward(m, x)) if mode == 'oracle' else (lambda x, m=m: moefy.MaskedFFN.forward(m, x))
    t = time.time(); nll = 0.0; n = 0
    with torch.no_grad():
        for s in range(0, N, 2048):
            w = ids[s:s + 2048][None]
            logits = model(w).logits[0]
            nll += F.cross_entropy(logits[:-1], w[0, 1:], reduction='sum').item(); n += w.shape[1] - 1
    print(f'{mode}: ppl {math.exp(nll / n):.3f} on {n} tokens ({time.time() - t:.0f} s)', flush=True)
