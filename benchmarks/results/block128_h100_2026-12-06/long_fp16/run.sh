set -u; export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p /tmp/serve
timeout 560 bash loadtest/gpu_serving.sh /tmp/serve 16,32,64 30s "qwen3_30b_long_alrkvd128_pieces_pc qwen3_30b_long_fp16_pc" loadtest/tenants_long_think.yaml 2>&1 | tail -30
tar czf $OUT/serve.tgz -C /tmp serve
python -m loadtest.compare /tmp/serve/* 2>&1 | tail -30
