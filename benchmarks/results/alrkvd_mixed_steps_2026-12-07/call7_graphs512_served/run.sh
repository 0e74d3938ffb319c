# Session 53, call I: ALR-KVD served at 32 users, mixed graphs to 512 tokens against 256, one call
export PYTHONPATH=.
mkdir -p $OUT/s
timeout 200 bash loadtest/gpu_serving.sh $OUT/s 32 20s "qwen3_30b_alrkvd_g512 qwen3_30b_alrkvd" > $OUT/served.log 2>&1
for m in qwen3_30b_alrkvd_g512 qwen3_30b_alrkvd; do echo "== $m"; grep -A3 "^| users | requests" $OUT/s/$m/report.md; done
rm -f $OUT/s/*/*.png
(cd $OUT && tar czf s.tgz s && rm -rf s)
