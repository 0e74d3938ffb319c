# One device call (from the repository root): issue 4's B=1 L=4k goal (ALR-KVD rank 16 no slower than FP16 SDPA),
# measured in 10 separate processes, each timing SDPA, the paged fp16 kernel and the ALR-KVD kernel in the same run,
# so that the spread between runs (0.95-1.02x over three earlier sessions) is measured rather than guessed.
export PYTHONPATH=. ; D=benchmarks/results/b1_4k_repeat_2026-12-02
for i in $(seq 1 10); do
  timeout 120 python benchmarks/bench_attention.py --no-tune --variants alrkvd-r16 --batches 1 --lengths 4096 \
      --out $OUT/run$i.json > $OUT/run$i.log 2>&1 || echo "run $i failed"
done
python $D/summarize.py $OUT/run*.json
