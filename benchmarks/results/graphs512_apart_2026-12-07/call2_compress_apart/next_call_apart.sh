# As it ran (H100, session 54, HEAD eee08f6; the mixed-attention step failed there: fixed, rerun in call3). `:apart` then set rows_apart to max_num_seqs
# Session 54: the compression's first graph with 4 Cholesky QR passes against 6 (OLD_RITZ=1), then the decodes apart
# in ALR-KVD's mixed graphs (`PagedKVCache.rows_apart`, journal 36d): kernel probe, then the engine's short mix.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
for old in 1 ""; do
  OLD_RITZ=$old timeout 90 python .probe/compress_probe.py 2>&1 | grep -v "no tuned" | grep 'first_replay\|total_wall\|call_wall' | tr -d '\n'; echo " [old=$old]"
done
timeout 170 python benchmarks/bench_mixed_attention.py --arms fp16,alrkvd-gpu,alrkvd-gpu:apart \
  --contexts 226,1024,4096 --out $OUT/mixed_attention.json > $OUT/mixed_attention.txt 2>&1
echo "== mixed attention rc=$?"; grep -v "no tuned" $OUT/mixed_attention.txt | tail -12 | cut -c1-300
timeout 190 python benchmarks/bench_step_mix.py --arms alrkvd-gpu:layered8,alrkvd-gpu:layered8:apart --users 8,32 \
  --steps 100 --warmup 20 --out $OUT/mix_apart.json > $OUT/mix_apart.txt 2>&1
echo "== short mix rc=$?"; grep "users" $OUT/mix_apart.txt | grep -v "no tuned" | cut -c1-640
