"""The server side of the wire, outside the engine: launching tritonserver on a model repository, and
writing model repositories.

serve.py             `alrkvd-serve` (`python -m server.serve`): finds tritonserver, starts it as a subprocess
                     on model_repository/ (loopback, model control off), waits until the models are ready,
                     watches their stub processes, stops it cleanly (the drain file first)
model_config.py      a model's config.pbtxt `parameters`, in the shape Triton hands model.py; a throwaway
                     repository with some of them changed (tests, benchmarks)
dummy_repository.py  a model repository serving a full-size MoE shape with dummy weights (GPU load tests)

The engine (backend/) runs inside tritonserver's Python-backend stubs (model_repository/*/1/model.py); nothing
here imports it, except dummy_repository.py, which exports the engine's default tokenizer (GGUF) as
tokenizer.json and resolves KV presets to their formats.
"""
