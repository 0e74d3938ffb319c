"""Probe (not kept live): time each thread's part of serving a token, appended to /tmp/alrkvd_trace.jsonl every 2 s.
The trace arm of run.sh was a copy of model_repository/smollm2/1 whose model.py calls `trace_probe.install(self)`
at the end of `initialize` (after `self._start_event_loop()`); journal 2026-12-07 42a."""
import json
import threading
import time

now = time.time
records = []


def install(model):
    eng, core = model.engine, model.engine.engine
    step, take, deliver, on_launch = core.step, core._take, eng._deliver, core.on_launch

    def traced_step():
        t0 = now()
        out = step()
        plan = core.plan or []
        records.append(("step", t0, now(), sum(n == 1 for _, n in plan), sum(n for _, n in plan if n > 1),
                        core.layered_plan is not None, core.pending is not None, len(out)))
        return out

    def traced_take(s):
        t0 = now()
        out = take(s)
        records.append(("take", t0, now(), len(s.seqs)))
        return out

    def traced_deliver():
        records.append(("deliver", now(), len(eng.held)))
        deliver()

    def traced_launch():
        records.append(("launch", now(), len(eng.held)))
        on_launch()

    core.step, core._take, eng._deliver, core.on_launch = traced_step, traced_take, traced_deliver, traced_launch
    on_output = model._on_output

    def traced_output(req, out):
        records.append(("out", now(), req.request_id[-6:], out.num_output_tokens, out.finished))
        on_output(req, out)

    model._on_output = traced_output
    q = model._response_queue
    get = q.get

    def traced_get(*a, **k):
        item = get(*a, **k)
        records.append(("send", now(), q.qsize()))
        return item

    q.get = traced_get
    safely = model.metrics._safely

    def traced_safely(item):
        t0 = now()
        safely(item)
        records.append(("metric", t0, now(), item[0]))

    model.metrics._safely = traced_safely
    execute = model.execute

    def traced_execute(requests):
        records.append(("exec", now(), len(requests)))
        return execute(requests)

    model.execute = traced_execute

    def dump():
        done = 0
        while True:
            time.sleep(2)
            n = len(records)
            with open("/tmp/alrkvd_trace.jsonl", "a") as f:
                for r in records[done:n]:
                    f.write(json.dumps(r) + "\n")
            done = n

    threading.Thread(target=dump, daemon=True).start()
