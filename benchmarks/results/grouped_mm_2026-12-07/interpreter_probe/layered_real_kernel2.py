import sys, pathlib, tempfile, torch
sys.path.insert(0, ".")
import tests.engine.test_cuda_graphs as t

def run(real):
    tmp = pathlib.Path(tempfile.mkdtemp())
    engine = t.layered_engine(tmp, max_num_batched_tokens=128, kv_format="alrkvd")
    if real:
        engine.cache.decode_kernel = engine.cache.kernels.decode
    bs = engine.cache.block_size
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (bs - 4, bs + 3, 2 * bs + 7, bs + 20)]
    expected, plans = t.generate_with_arrivals(engine, prompts, bs + 4, arrivals=(2, 4))
    t.graph_layered_steps(engine)
    got, plans2 = t.generate_with_arrivals(engine, prompts, bs + 4, arrivals=(2, 4))
    for i, (a, b) in enumerate(zip(expected, got)):
        first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
        print("real" if real else "ref", "prompt", i, "first differing token", first, "of", len(a))
    print("plans equal", plans == plans2)

run(False)
run(True)
