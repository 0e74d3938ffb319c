"""Householder-QR and Cholesky-QR subspace bases on real SmolLM2 blocks (10 layers x 4 blocks of 64 x 6 streams):
same directions, which sign. Output on CPU, 2026-11-30: "leading 16 directions: max 1-|cos| 1.20e-12; opposite sign 2200,
same sign 1640". Run from the repository root."""
import sys, torch
sys.path.insert(0, '.'); sys.path.insert(0, 'benchmarks')
from backend.engine import EngineArgs, LLMEngine
from backend.kv_formats import subspace_eigh
from bench_basis import subspace_householder
torch.set_num_threads(2)
eng = LLMEngine(EngineArgs(kv_format="fp16", kv_budget_bytes=64 << 20, max_num_seqs=1))
ids = eng.tokenizer.encode(open('data/wikitext-2-raw/wiki.test.raw').read(20000), add_special_tokens=False)[:512]
rec = {}
orig = eng.cache.attend
def attend(layer, q, k, *rest):
    rec[layer] = (k.float().clone(), rest[-2].float().clone()); return orig(layer, q, k, *rest)
eng.cache.attend = attend; eng.score(ids, chunk_size=512); eng.cache.attend = orig
flips = same = 0; worst = 0.0
for layer in range(0, 30, 3):
    k, v = rec[layer]
    for b in range(4):
        X = torch.cat([k[b*64:(b+1)*64], v[b*64:(b+1)*64]], 1).permute(1, 0, 2).contiguous()
        G = (X.mT @ X).double()
        w1, U1 = subspace_eigh(G, 24, 1234); w2, U2 = subspace_householder(G, 24, 1234)
        d = (U1 * U2).sum(-2)[..., -16:]          # cosines of the leading 16 directions
        worst = max(worst, (1 - d.abs()).max().item())
        flips += int((d < 0).sum()); same += int((d > 0).sum())
print(f"leading 16 directions: max 1-|cos| {worst:.2e}; opposite sign {flips}, same sign {same}")
