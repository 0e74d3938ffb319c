"""The scheduler under a virtual clock (journal 2026-12-05 20b): the real engine (CPU, tiny dummy Qwen3-MoE) plans the
steps, a cost fitted to the H100's figures times them, and StepCost learns from those times. Closed-loop users, one
in three a document. STALL=ms adds that much to the first step of each of the first STALL_N new sizes (a kernel
compiled on first use). From the repository root:
    STALL_N=3 STALL=2000 PYTHONPATH=. python benchmarks/results/serving_long_h100_2026-12-05d/simclock.py 8 60 80
(users, seconds, max_step_ms); its output at 4051ec3 and at 9db394d: simclock.txt."""
import json, os, sys, tempfile, random
from backend.engine import EngineArgs, LLMEngine
from backend.sampling import SamplingParams
CFG = dict(model_type="qwen3_moe", vocab_size=512, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
           num_key_value_heads=1, head_dim=32, intermediate_size=64, moe_intermediate_size=32, num_experts=4,
           num_experts_per_tok=2, norm_topk_prob=True, rms_norm_eps=1e-6, rope_theta=1e6,
           max_position_embeddings=40960, tie_word_embeddings=False)
FIXED = float(os.environ.get("FIXED", 30))   # ms a step with a prompt chunk costs over a decode-only one
PER_TOKEN, PER_HIST = 0.032, 2.2e-6          # ms per prompt token; ms per prompt token per cached token it attends

def cost(plan_hist):
    dec = sum(1 for n, h, d in plan_hist if d)
    chunks = [(n, h) for n, h, d in plan_hist if not d]
    ms = 11 + 0.45 * dec
    if chunks:
        ms += FIXED + PER_TOKEN * sum(n for n, _ in chunks) + PER_HIST * sum(n * (h + n / 2) for n, h in chunks)
    return ms

def run(users, seconds, target, seed=0):
    d = tempfile.mkdtemp(); open(os.path.join(d, "config.json"), "w").write(json.dumps(CFG))
    eng = LLMEngine(EngineArgs(model=d, load_format="dummy", tokenizer="none", device="cpu", dtype="float32",
                               kv_budget_bytes=int(os.environ.get("KV_TOKENS", 87000)) * 256, max_num_seqs=64, max_num_batched_tokens=2048,
                               max_step_ms=target, max_model_len=40960, enforce_eager=True))
    print("  KV capacity tokens", eng.cache.allocator.num_blocks * eng.cache.block_size)
    rng = random.Random(seed)
    sched = eng.schedule
    hist = {}
    def schedule():
        plan = sched()
        hist["plan"] = [(n, s.kv.num_tokens - n, s.num_pending == n and n == 1 and s.output_ids != []) for s, n in plan]
        return plan
    eng.schedule = schedule
    observe = eng.step_cost.observe
    now = [0.0]; steps = []; seen = set()
    def fake_observe(tokens, _ms):
        ms = cost(hist["plan"])
        b = round(4 * __import__("math").log2(tokens))
        if os.environ.get("STALL") and b not in seen and tokens > 24 and len(seen) < int(os.environ.get("STALL_N", 99)):
            seen.add(b); ms += float(os.environ["STALL"])  # a first step of this size compiles a kernel
        now[0] += ms; steps.append((now[0], ms, hist["plan"]))
        observe(tokens, ms)
    eng.step_cost.observe = fake_observe
    active = {}  # rid -> (user, kind, arrival, first_token_time)
    done = []
    def submit(user):
        kind = user[1]
        n = rng.randint(16000, 32000) if kind == "doc" else rng.randint(2000, 6000)
        out = 32 if kind == "doc" else rng.randint(64, 128)
        rid = eng.add_request(None, SamplingParams(max_tokens=out, temperature=0, ignore_eos=True),
                              prompt_ids=[rng.randrange(1, 500) for _ in range(n)])
        active[rid] = [user, kind, now[0], None, n]
    for u in users:
        submit(u)
    while now[0] < seconds * 1e3:
        outs = eng.step()
        if not eng.plan:
            now[0] += 1.0
        for o in outs:
            a = active[o.request_id]
            if a[3] is None:
                a[3] = now[0]
            if o.finished:
                done.append((a[1], a[2], a[3], now[0], a[4])); del active[o.request_id]; submit(a[0])
    for kind in ("doc", "chat"):
        t = sorted(f - a for k, a, f, e, n in done if k == kind)
        print(f"target {target} {kind}: {len(t)} done, ttft p50 {t[len(t)//2]/1e3 if t else float('nan'):.2f} s"
              f" max {t[-1]/1e3 if t else float('nan'):.2f} s; pending {sum(1 for a in active.values() if a[1]==kind)}")
    ms = sorted(s[1] for s in steps)
    chunk_sizes = [sum(n for n, h, d in p if not d) for _, _, p in steps if any(not d for n, h, d in p)]
    print(f"  preemptions {eng.num_preemptions}")
    print(f"  steps {len(steps)}, ms p50 {ms[len(ms)//2]:.1f} p90 {ms[int(len(ms)*.9)]:.1f} max {ms[-1]:.1f}; "
          f"prompt tokens/step p50 {sorted(chunk_sizes)[len(chunk_sizes)//2] if chunk_sizes else 0}, "
          f"prefill tok/s {sum(chunk_sizes)/now[0]*1e3:.0f}")
    print("  curve", {b: (round(x), round(y, 1)) for b, (x, y) in sorted(eng.step_cost.curve.items())})
    print("  first steps", [(round(ms), sum(n for n, h, d in p)) for _, ms, p in steps[:30]])
    return steps

if __name__ == "__main__":
    n_users = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    users = [(i, "doc" if i % 3 == 0 else "chat") for i in range(n_users)]
    run(users, float(sys.argv[2]) if len(sys.argv) > 2 else 60, float(sys.argv[3]) if len(sys.argv) > 3 else 80)
