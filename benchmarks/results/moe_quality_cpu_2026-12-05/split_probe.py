"""Probe (journal 2026-12-05 12b): perplexity of splits before distillation, with a least-squares router fitted on
CAL validation tokens and with an oracle choosing each token's experts by their true output size.

  .venv/bin/python benchmarks/results/moe_quality_cpu_2026-12-05/split_probe.py free current all_tokens log \
      top_member signed centered                      # clustering features (128 x 8, top 32, shared 512)
  .venv/bin/python benchmarks/results/moe_quality_cpu_2026-12-05/split_probe.py E256_64_512 E128_43_384 ...
      # E<experts>_<top k>_<shared>: granularity
"""
import math, os, sys, time, torch, torch.nn.functional as F
sys.path.insert(0, '.')
from transformers import AutoModelForCausalLM
from backend import moefy
from backend.tokenizer import Tokenizer, default_model_path
torch.set_num_threads(int(os.environ.get('THREADS', 2)))
CAL = int(os.environ.get('CAL', 4096)); N = int(os.environ.get('TOKENS', 4096))
g = default_model_path(); tok = Tokenizer.load(g)
model = AutoModelForCausalLM.from_pretrained(os.path.dirname(g), gguf_file=os.path.basename(g), dtype=torch.float32).eval()
layers = model.model.layers
W = [(l.mlp.gate_proj.weight.detach(), l.mlp.up_proj.weight.detach(), l.mlp.down_proj.weight.detach()) for l in layers]
cal = torch.tensor(tok.encode(open(moefy.CALIBRATION_TEXT, encoding='utf-8').read(), add_special_tokens=False)[:CAL])
inputs = [[] for _ in layers]
hooks = [l.mlp.register_forward_pre_hook(lambda m, a, i=i: inputs[i].append(a[0][0].detach())) for i, l in enumerate(layers)]
with torch.no_grad():
    for s in range(0, CAL, 2048): model(cal[s:s + 2048][None])
for h in hooks: h.remove()
X = [torch.cat(x) for x in inputs]
test = torch.tensor(tok.encode(open('data/wikitext-2-raw/wiki.test.raw', encoding='utf-8').read(), add_special_tokens=False)[:N])

class Oracle(torch.nn.Module):
    def __init__(self, w, expert_of, E, k, free=0):
        super().__init__(); self.w, self.expert_of, self.E, self.k, self.free = w, expert_of, E, k, free
    def forward(self, x):
        gate, up, down = self.w
        h = F.silu(x @ gate.T) * (x @ up.T); size = h.abs() * down.norm(dim=0)
        if getattr(self, 'router', None) is not None:
            ch = torch.zeros(*x.shape[:-1], self.E + 1).scatter_(-1, (x @ self.router.T).topk(self.k, dim=-1).indices, 1.0); ch[..., -1] = 1
            return (h * ch[..., self.expert_of]) @ down.T
        if self.free:   # neuron-level: the shared ones and the `free` largest of the rest
            s = size.masked_fill(self.expert_of == self.E, float('inf'))
            keep = torch.zeros_like(h).scatter_(-1, s.topk(self.free + int((self.expert_of == self.E).sum()), dim=-1).indices, 1.0)
            return (h * keep) @ down.T
        pe = torch.zeros(*x.shape[:-1], self.E + 1).index_add_(-1, self.expert_of, size)[..., :-1]
        ch = torch.zeros(*x.shape[:-1], self.E + 1).scatter_(-1, pe.topk(self.k, dim=-1).indices, 1.0); ch[..., -1] = 1
        return (h * ch[..., self.expert_of]) @ down.T

def ppl():
    nll = 0.0; n = 0
    with torch.no_grad():
        for s in range(0, N, 2048):
            w = test[s:s + 2048][None]; lg = model(w).logits[0]
            nll += F.cross_entropy(lg[:-1], w[0, 1:], reduction='sum').item(); n += w.shape[1] - 1
    return math.exp(nll / n)

def variant(name, shared, E, k, feature, free=0):
    t = time.time()
    for i, l in enumerate(layers):
        gate, up, down = W[i]
        prof = moefy.neuron_sizes(X[i], gate, up, down)          # [N, I]
        order = prof.mean(0).argsort(descending=True)
        sh, rest = order[:shared], order[shared:].sort().values
        expert_of = torch.full((gate.shape[0],), E)
        if E:
            groups = moefy.balanced_bisect(feature(prof[:, rest], X[i], gate, up, rest), E)
            for e, gr in enumerate(groups): expert_of[rest[gr]] = e
        l.mlp = Oracle(W[i], expert_of, E, k, free)
        if E and not free:
            l.mlp.router = moefy.fit_router(X[i], torch.zeros(len(X[i]), E + 1).index_add_(-1, expert_of, prof)[:, :-1])
    r = ppl()
    for l in layers: l.mlp.router = None
    print(f'{name}: router ppl {r:.3f}, oracle ppl {ppl():.3f} ({time.time() - t:.0f} s)', flush=True)

feats = {
  'current': lambda p, x, g, u, r: F.normalize(p[::max(1, len(p) // 1024)].T, dim=1),
  'all_tokens': lambda p, x, g, u, r: F.normalize(p.T, dim=1),
  'log': lambda p, x, g, u, r: F.normalize(torch.log(p.T + 1e-3 * p.mean()), dim=1),
  'top_member': lambda p, x, g, u, r: F.normalize((p >= p.quantile(0.75, dim=1, keepdim=True)).float().T, dim=1),
  'signed': lambda p, x, g, u, r: F.normalize((F.silu(x @ g[r].T) * (x @ u[r].T)).T, dim=1),
  'centered': lambda p, x, g, u, r: F.normalize((p / p.mean(0) - 1).T, dim=1),
}
which = sys.argv[1:] or list(feats)
for name in which:
    if name == 'free':
        variant('neuron-level, shared 512 + 256 free', 512, 128, 32, feats['current'], free=256)
    elif name.startswith('E'):
        E, k, sh = name[1:].split('_'); variant(name, int(sh), int(E), int(k), feats['current'])
    else:
        variant(name, 512, 128, 32, feats[name])
