"""Locust load tests of the streaming Triton deployment (docs/LOADTEST.md).

metrics.py  per-request metrics, exact percentiles, goodput, failure kinds (pure functions)
sse.py      incremental Server-Sent Events parser for generate_stream
tenants.py  tenants YAML and seeded prompt streams
records.py  the raw requests.jsonl and run.json
users.py    gRPC-stream and SSE adapters, abstract users, one user class per tenant (imports gevent)
shapes.py   fixed concurrency, stepped sweep, Poisson arrivals (LoadTestShape)
locustfile.py  Locust entry: options, hooks, record sink (master/worker)
report.py   summary.json, report.md, PNG plots from the raw files
run.py      `python -m loadtest.run`: headless Locust run + report (`make loadtest`)
kv_benchmark.py  A/B of KV-cache formats on the default model (BENCHMARKS.md)
fuzz.py     `python -m loadtest.fuzz`: malformed and random requests over HTTP and gRPC, answers classified (`make fuzz`)
soak.py     `python -m loadtest.soak`: long mixed load with cancels and bad requests, watching the
            server's memory, KV blocks, fds and threads (`make soak`)
"""
