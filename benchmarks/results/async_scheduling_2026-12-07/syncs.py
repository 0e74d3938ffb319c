"""Probe (issue 33, journal 2026-12-07 42a; written, not yet run on the GPU): where the engine thread waits on the
GPU under a served-like load with queued steps. 32 users (half short chats of 64 tokens, half 300-600-word prompts
of 128), the served GPU config, `torch.cuda.set_sync_debug_mode("warn")` after a warm-up; each synchronizing call
counted by its stack.
    python benchmarks/results/async_scheduling_2026-12-07/syncs.py FORMAT SECONDS [cpu]
(on the GPU machine, the repository of `server.dummy_repository` in reports/gpu_repository for its weights; `cpu`:
a check of the script)"""
import asyncio, collections, random, sys, time, traceback, warnings
sys.path.insert(0, ".")
import torch
from backend.engine import AsyncEngine, EngineArgs, SamplingParams

fmt, seconds = sys.argv[1], float(sys.argv[2])
W = "reports/gpu_repository/weights"
if len(sys.argv) > 3:  # a check of this script on the CPU
    args = EngineArgs(kv_format="fp16", max_num_seqs=8, async_scheduling=True)
else:
    args = EngineArgs(model=W, load_format="dummy", tokenizer=W, device="cuda", kv_format=fmt, kv_budget_bytes=16 << 30,
                      max_model_len=8192, max_num_seqs=32, max_num_batched_tokens=2048, layered_prefill=8,
                      moe_routing="seeded", async_scheduling=True)
WORDS = "the of and to in is was for on as with by he at from his an were are which this be or has had not".split()
stacks, armed = collections.Counter(), [False]


def show(message, category, filename, lineno, file=None, line=None):
    if not armed[0]:
        return
    frames = [f for f in traceback.extract_stack()[:-1] if "/backend/" in f.filename or "/kernels/" in f.filename]
    key = " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in reversed(frames[-7:]))
    stacks[(str(message)[:60], key)] += 1


warnings.showwarning = show
warnings.simplefilter("always")


async def user(i, eng, stop):
    rng, k = random.Random(i), 0
    while time.monotonic() < stop:
        long = i % 2 == 1
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(300, 600) if long else rng.randint(12, 40)))
        params = SamplingParams(max_tokens=128 if long else 64, temperature=0, ignore_eos=True)
        async for _ in eng.generate(prompt, params, f"u{i}-{k}"):
            pass
        k += 1


async def main():
    t0 = time.monotonic()
    eng = AsyncEngine(args)
    print(f"engine up in {time.monotonic() - t0:.0f} s", flush=True)
    warm, stop = 8.0, time.monotonic() + 8.0 + seconds
    users = [asyncio.create_task(user(i, eng, stop)) for i in range(args.max_num_seqs)]
    await asyncio.sleep(warm)
    n0 = len(eng.steps)
    if args.device != "cpu":
        torch.cuda.set_sync_debug_mode("warn")
    armed[0] = True
    await asyncio.sleep(seconds)
    armed[0] = False
    if args.device != "cpu":
        torch.cuda.set_sync_debug_mode(0)
    steps = len(eng.steps) - n0
    await asyncio.gather(*users)
    eng.shutdown()
    print(f"== {fmt}: {steps} steps in {seconds:.0f} s; {sum(stacks.values())} synchronizing calls")
    for (msg, key), n in stacks.most_common(20):
        print(f"{n:6d}  {msg}\n        {key}")

asyncio.run(main())
