# Session 55: served 1 / 8 / 32 users, both caches, every default (overlap_outputs on) against overlap off.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
for m in qwen3_30b qwen3_30b_alrkvd; do d=reports/gpu_repository/${m}_hold; mkdir -p $d
  cp -a reports/gpu_repository/$m/1 $d/1
  sed -e "s/name: \"$m\"/name: \"${m}_hold\"/" \
      -e 's/parameters: \[/parameters: [\n  { key: "overlap_outputs", value: { string_value: "false" } },/' \
      reports/gpu_repository/$m/config.pbtxt > $d/config.pbtxt
done
grep -n "overlap\|name:" reports/gpu_repository/qwen3_30b_hold/config.pbtxt | head -3
mkdir -p $OUT/s
timeout 420 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "${MODELS:-qwen3_30b_alrkvd qwen3_30b_alrkvd_hold qwen3_30b qwen3_30b_hold}" > $OUT/served.log 2>&1
echo "served rc=$?"
for m in ${MODELS:-qwen3_30b_alrkvd qwen3_30b_alrkvd_hold qwen3_30b qwen3_30b_hold}; do echo "== $m"; grep -A5 "^| users | requests" $OUT/s/$m/report.md | grep -v "^|---"; done
rm -f $OUT/s/*/*.png; (cd $OUT && tar czf s.tgz s && rm -rf s)
