"""Why the first step of a layered batch is ~11 ms slower (H200 mix, fp16:layered8): each part of a step timed
(synchronised), and torch.profiler over a first-group and a later-group _run_layers."""
import sys, time, statistics, collections
import torch
sys.path.insert(0, ".")
from benchmarks import bench_step_mix as m

arm = sys.argv[1] if len(sys.argv) > 1 else "fp16:layered8"
engine = m.served_engine(arm)
engine.graphs.capture_all()
parts = collections.defaultdict(float)

def timed(obj, name, label=None):
    fn = getattr(obj, name)
    def w(*a, **k):
        torch.cuda.synchronize(); t = time.perf_counter()
        out = fn(*a, **k)
        torch.cuda.synchronize(); parts[label or name] += (time.perf_counter() - t) * 1e3
        return out
    setattr(obj, name, w)

profiled = {"first": 0, "later": 0}
run_layers = engine._run_layers
def run_layers_maybe_profiled(*a, **k):
    kind = "first" if engine.layered.next_layer == 0 else "later"
    if profiled[kind] < 1 and len(steps) > 40:
        profiled[kind] += 1
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as p:
            out = run_layers(*a, **k)
            torch.cuda.synchronize()
        print(f"--- {kind} group profile", flush=True)
        print(p.key_averages().table(sort_by="cpu_time_total", row_limit=22, max_name_column_width=60), flush=True)
        return out
    return run_layers(*a, **k)
engine._run_layers = run_layers_maybe_profiled
timed(engine, "schedule"); timed(engine, "_run"); timed(engine, "_run_layers")
timed(engine.model, "forward_layers"); timed(engine.model.embed_tokens, "forward", "embed")
timed(engine.cache, "commit"); timed(engine, "_sample")
steps = []
step = engine.step
def stepped():
    parts.clear()
    t = time.perf_counter(); out = step(); torch.cuda.synchronize()
    plan = engine.layered_plan
    steps.append(((time.perf_counter() - t) * 1e3, None if plan is None else plan[1], dict(parts)))
    return out
engine.step = stepped
m.run(engine, 8, 120, 20)
for ms, first, p in steps[20:]:
    if first is not None:
        print(f"{ms:6.1f} ms first layer {first:2d}: " + ", ".join(f"{k} {v:.1f}" for k, v in p.items()), flush=True)
