# next session's first call (prepared in session 45): long-context tenants with prefix caching, ALR-KVD then fp16
# (reports/gpu_repository/*_pc; users now continue their own 8-turn chats). bash .probe/stash.sh first; carry
# [".probe", ".device", "reports/gpu_repository"]; command: source .device/setup.sh && bash .probe/next.sh
set -u; export PYTHONUNBUFFERED=1
mkdir -p $OUT/pc
t0=$(date +%s)
(while sleep 5; do python -c "
import urllib.request
t = urllib.request.urlopen('http://127.0.0.1:8002/metrics', timeout=2).read().decode()
print('\n'.join(l for l in t.splitlines() if 'prefix_cache' in l or 'prompt_tokens_total' in l or 'preemptions' in l))
" > $OUT/pc/m.txt 2>/dev/null && [ -s $OUT/pc/m.txt ] && cat $OUT/pc/m.txt >> $OUT/pc/metrics.txt; done) &
timeout 560 bash loadtest/gpu_serving.sh $OUT/pc 4,8,16,32 30s "qwen3_30b_long_alrkvd_pieces_pc qwen3_30b_long_fp16_pc" \
  loadtest/tenants_long.yaml 2>&1 | grep -v "Warning\|no tuned" | tail -20
echo "done $(( $(date +%s) - t0 )) s"
python -m loadtest.compare $OUT/pc/qwen3_30b_long_fp16_pc $OUT/pc/qwen3_30b_long_alrkvd_pieces_pc --out $OUT/pc/compare \
  2>&1 | head -30
grep -h -A3 "Traceback\|Error" $OUT/pc/server_*.log | head -30
tail -3 $OUT/pc/metrics.txt
