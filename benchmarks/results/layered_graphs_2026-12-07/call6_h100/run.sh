export PYTHONPATH=.
ms="qwen3_30b_alrkvd_layered8 qwen3_30b"
mkdir -p $OUT/s
timeout 420 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "$ms" > $OUT/served_log.txt 2>&1
for m in $ms; do echo "== $m"; grep -A5 "^| users | requests" $OUT/s/$m/report.md; done
grep -i "error\|Traceback" $OUT/s/server_*.log | head -5 | cut -c1-300
rm -f $OUT/s/*/*.png $OUT/s/*/locust* $OUT/s/*/requests.jsonl
(cd $OUT && tar czf s.tgz s && rm -rf s)
