# call 4 (session 44): long-context tenants through tritonserver with the tiles launches' splits from the context:
# ALR-KVD (graph pieces for heavy steps) then fp16, 8 GB of KV, 4 -> 32 users
set -u; export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
for m in qwen3_30b_long_alrkvd_pieces qwen3_30b_long_fp16; do
  t0=$(date +%s)
  timeout 285 bash loadtest/gpu_serving.sh $OUT/r 4,8,16,32 30s $m loadtest/tenants_long.yaml 2>&1 \
    | grep "measured requests\|engine:" | tail -3
  pkill -f server.serve; sleep 3
  echo "$m $(( $(date +%s) - t0 )) s"
done
tar czf $OUT/serving_long.tgz -C $OUT r && rm -rf $OUT/r
