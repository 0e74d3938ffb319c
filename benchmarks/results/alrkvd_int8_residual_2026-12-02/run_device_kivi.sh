# Ran on the tree of commit 2d82786: check that commit out to measure the same code.
# Device call 7 (from the repository root): the kernel tests compiled; the KIVI kernel before (kivi_attention_before.py:
# four waves of one program per SM) and after (whole waves of the programs it runs at once), alternated twice; the
# ALR-KVD kernel through the shared split rule.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_int8_residual_2026-12-02
timeout 150 python -m pytest -q tests/test_kernels_alrkvd_attention.py tests/test_kernels_kivi_attention.py tests/test_kernels_paged_attention.py 2>&1 | grep -E "Error|FAILED|passed|failed" | head
cp kernels/kivi_attention.py /tmp/after.py
for round in 1 2; do
  for v in before after; do
    if [ $v = before ]; then cp $D/kivi_attention_before.py kernels/kivi_attention.py; else cp /tmp/after.py kernels/kivi_attention.py; fi
    timeout 100 python benchmarks/bench_attention.py --no-tune --variants kivi2 kivi4 $([ $v$round = after1 ] && echo alrkvd-rot-r16) \
      --batches 1 8 32 --lengths 4096 32768 --out $OUT/kivi_${v}_$round.json 2>&1 | grep -E "kivi|alrkvd" | grep -v "no tuned" | sed "s/^/$v $round /"
  done
done
cp /tmp/after.py kernels/kivi_attention.py
