# the long-context tenants with pauses, ALR-KVD in blocks of 64 against 128, one call; then a 2,048-token chunk's profile
set -u; export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p /tmp/serve
timeout 420 bash loadtest/gpu_serving.sh /tmp/serve 16,32,64 30s "qwen3_30b_long_alrkvd64_pieces_pc qwen3_30b_long_alrkvd128_pieces_pc" loadtest/tenants_long_think.yaml 2>&1 | grep "measured requests\|engine:" | tail -8
tar czf $OUT/serve.tgz -C /tmp serve
python -m loadtest.compare /tmp/serve/qwen3_30b_long_alrkvd64_pieces_pc /tmp/serve/qwen3_30b_long_alrkvd128_pieces_pc --out /tmp/cmp 2>&1 | tail -14
timeout 60 python benchmarks/profile_mixed_step.py --batch 0 --tokens 2048 --context 0 --graphs 2>&1 | grep -v "Warning\|no tuned" | tail -12
