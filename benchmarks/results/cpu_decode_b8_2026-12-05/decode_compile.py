"""One layer's decode of 8 sequences' 32 closed ALR-KVD blocks on the CPU, under torch.profiler; with an argument,
against torch.compile (inductor, dynamic) of the same function (journal 2026-12-05 22a). Run from the repository
root: PYTHONPATH=. python benchmarks/results/cpu_decode_b8_2026-12-05/decode_compile.py [compile]"""
import os, sys, time
sys.path.insert(0, ".")
import torch
from backend.engine import EngineArgs, LLMEngine
from backend.sampling import SamplingParams
eng = LLMEngine(EngineArgs(model="default", weight_dtype="float16", kv_format="alrkvd-cpu", kv_budget_bytes=128 << 20,
                           max_model_len=2048, max_num_seqs=8))
ids = eng.tokenizer.encode(open("data/wikitext-2-raw/wiki.test.raw").read()[:60000])
for i in range(8):
    eng.add_request(None, SamplingParams(max_tokens=64, temperature=0, ignore_eos=True),
                    prompt_ids=ids[i * 300:(i + 1) * 300])
while any(s.num_pending > 1 for s in eng.running + eng.waiting):
    eng.step()
fmt = eng.cache.format
blocks = [b for s in eng.running for b in s.kv.block_table[:4]]
print("blocks", len(blocks), "dtype", eng.cache.dtype, fmt.options)
starts = torch.tensor([j * 64 for s in eng.running for j in range(4)])
def bench(f, n=20):
    f(); t = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t) / n * 1e3
print("decode one layer ms", bench(lambda: fmt.decode(5, blocks, starts)))
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(10): fmt.decode(5, blocks, starts)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
torch.save({"blocks": blocks}, "/tmp/blocks.pt")
if len(sys.argv) > 1:
    import torch._dynamo
    ref = fmt.decode(5, blocks, starts)
    ids_t = fmt._ids(blocks, fmt.device)
    comp = torch.compile(fmt._decode, dynamic=True)
    t = time.perf_counter(); out = comp(5, ids_t, starts); print("compile s", time.perf_counter() - t)
    print("max diff", (out[0] - ref[0]).abs().max().item(), (out[1] - ref[1]).abs().max().item())
    print("compiled ms", bench(lambda: comp(5, ids_t, starts)))
