# Next session's first call (prepared in session 53): issue 33's served figures with mixed graphs to 512 tokens
# against 256, both caches, 1 / 8 / 32 users. Prepare here first:
#   rm -rf reports/gpu_repository
#   for f in fp16 alrkvd-gpu; do n=qwen3_30b; [ $f = fp16 ] || n=qwen3_30b_alrkvd
#     python -m server.dummy_repository --out reports/gpu_repository --name $n --kv-format $f
#     python -m server.dummy_repository --out reports/gpu_repository --name ${n}_g512 --kv-format $f --cuda-graph-max-tokens 512
#   done; rm -rf reports/gpu_repository/*_eager
# (about 115 s a model: two calls of two models each, ALR-KVD first)
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/s
timeout 575 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "${MODELS:-qwen3_30b_alrkvd_g512 qwen3_30b_alrkvd qwen3_30b_g512 qwen3_30b}" > $OUT/served.log 2>&1
for m in ${MODELS:-qwen3_30b_alrkvd_g512 qwen3_30b_alrkvd qwen3_30b_g512 qwen3_30b}; do echo "== $m"; grep -A5 "^| users | requests" $OUT/s/$m/report.md; done
rm -f $OUT/s/*/*.png
(cd $OUT && tar czf s.tgz s && rm -rf s)
