"""Would a baseline whose prompt rows also go through the kernel (mixed graphs of 128 rows, no layering) give the
layered graph run's tokens with the real ALR-KVD kernel under the interpreter?"""
import sys, pathlib, tempfile, torch
sys.path.insert(0, ".")
import tests.engine.test_cuda_graphs as t
from backend.cuda_graphs import StepGraphs

def prompts_for(engine):
    bs = engine.cache.block_size
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 512, (n,), generator=g).tolist() for n in (bs - 4, bs + 3, 2 * bs + 7, bs + 20)], bs

layered = t.layered_engine(pathlib.Path(tempfile.mkdtemp()), max_num_batched_tokens=128, kv_format="alrkvd")
layered.cache.decode_kernel = layered.cache.kernels.decode
prompts, bs = prompts_for(layered)
t.graph_layered_steps(layered)
a, _ = t.generate_with_arrivals(layered, prompts, bs + 4, arrivals=(2, 4))

mixed = t.layered_engine(pathlib.Path(tempfile.mkdtemp()), max_num_batched_tokens=128, kv_format="alrkvd", groups=1)
mixed.cache.decode_kernel = mixed.cache.kernels.decode
mixed.graphs = StepGraphs(mixed.model, mixed.cache, 4, mixed.max_model_len, max_tokens=128, capture=False)
mixed.graphs.capture_all()
b, _ = t.generate_with_arrivals(mixed, prompts, bs + 4, arrivals=(2, 4))
for i, (x, y) in enumerate(zip(a, b)):
    print("prompt", i, "first differing token", next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), None))
