import sys, pathlib, tempfile, torch
sys.path.insert(0, ".")
import tests.engine.test_cuda_graphs as t
def first_diff(a, b):
    return [next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), None) for x, y in zip(a, b)]
res = {}
for groups, mt, graphs in [(2, 0, False), (1, 0, False), (1, 128, True), (2, 128, True), (2, 16, True), (1, 16, True)]:
    e = t.layered_engine(pathlib.Path(tempfile.mkdtemp()), max_num_batched_tokens=128, kv_format="alrkvd", groups=groups)
    bs = e.cache.block_size
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (bs - 4, bs + 3, 2 * bs + 7, bs + 20)]
    if graphs:
        t.graph_layered_steps(e, max_tokens=mt)
    res[(groups, mt)] = t.generate_with_arrivals(e, prompts, bs + 4, arrivals=(2, 4))
base = res[(1, 128)]
for k, (toks, plans) in res.items():
    print(k, "vs unlayered mixed-128:", first_diff(toks, base[0]), "vs eager layered:", first_diff(toks, res[(2, 0)][0]),
          "plans = eager layered:", plans == res[(2, 0)][1])
