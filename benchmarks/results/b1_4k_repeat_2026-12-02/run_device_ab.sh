# One device call (from the repository root): the one-pass merge (`merge_if_last`, the working tree) against the
# two-pass merge before it (merge_online.patch reversed), alternated in 6 pairs of separate processes at B=1 L=4k,
# SDPA and the paged fp16 kernel timed in every process; the kernel and CUDA-graph tests compiled first.
export PYTHONPATH=. ; D=benchmarks/results/b1_4k_repeat_2026-12-02
timeout 240 python -m pytest -q tests/test_kernels_alrkvd_attention.py tests/test_cuda_graphs.py 2>&1 \
    | grep -E "Assertion|Error|FAILED|passed|failed" | head
bench() { timeout 120 python benchmarks/bench_attention.py --no-tune --variants alrkvd-r16 --batches 1 --lengths 4096 \
    --out $OUT/$1.json > $OUT/$1.log 2>&1 || echo "$1 failed"; }
for i in 1 2 3 4 5 6; do
  bench one_pass_$i
  git apply -R $D/merge_online.patch && bench two_pass_$i && git apply $D/merge_online.patch
done
echo "one-pass merge:"; python $D/summarize.py $OUT/one_pass_*.json
echo "two-pass merge:"; python $D/summarize.py $OUT/two_pass_*.json
