# the served preset in blocks of 128 (alrkvd-gpu now) against fp16 under gpu_serving.sh's default load, one call
set -u; export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p /tmp/serve
timeout 480 bash loadtest/gpu_serving.sh /tmp/serve 1,8,32 20s "qwen3_30b_alrkvd qwen3_30b" 2>&1 | grep "measured requests\|engine:" | tail -8
tar czf $OUT/serve.tgz -C /tmp serve
python -m loadtest.compare /tmp/serve/qwen3_30b_alrkvd /tmp/serve/qwen3_30b --out /tmp/cmp 2>&1 | tail -12
