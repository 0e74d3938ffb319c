# long-context tenants with think time (loadtest/tenants_long_think.yaml), prefix caching, ALR-KVD then fp16
set -u; export PYTHONUNBUFFERED=1
mkdir -p $OUT/th
t0=$(date +%s)
(while sleep 5; do python -c "
import urllib.request
t = urllib.request.urlopen('http://127.0.0.1:8002/metrics', timeout=2).read().decode()
print('\n'.join(l for l in t.splitlines() if not l.startswith('#') and ('prefix_cache' in l or 'prompt_tokens_total' in l or 'preemptions' in l)))
" > /tmp/m.txt 2>/dev/null && [ -s /tmp/m.txt ] && (date +%s; cat /tmp/m.txt) >> $OUT/th/metrics.txt; done) &
timeout 390 bash loadtest/gpu_serving.sh $OUT/th 16,32,64 30s "qwen3_30b_long_alrkvd_pieces_pc qwen3_30b_long_fp16_pc" \
  loadtest/tenants_long_think.yaml 2>&1 | grep -v "Warning\|no tuned" | grep "measured requests\|engine:" 
echo "done $(( $(date +%s) - t0 )) s"
python -m loadtest.compare $OUT/th/qwen3_30b_long_fp16_pc $OUT/th/qwen3_30b_long_alrkvd_pieces_pc --out $OUT/th/compare \
  2>&1 | head -40
grep -h -A3 "Traceback" $OUT/th/server_*.log | head -20
cd $OUT/th && tar czf runs.tgz --exclude=locust.html --exclude='*.png' qwen3_30b_long_alrkvd_pieces_pc qwen3_30b_long_fp16_pc \
  && rm -rf qwen3_30b_long_alrkvd_pieces_pc qwen3_30b_long_fp16_pc server_*.log; ls -la $OUT/th
tail -8 $OUT/th/metrics.txt
