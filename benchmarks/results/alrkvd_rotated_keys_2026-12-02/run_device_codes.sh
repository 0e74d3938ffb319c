# Device call 4 (from the repository root): basis and latent codes straight to tl.dot (fp16 by bit pattern, scales
# folded into the [G, R] products) against the kernel before it (alrkvd_attention_before_codes.py, the tree's
# kernel at the commit before), alternated twice in separate processes; the kernel tests compiled first.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_rotated_keys_2026-12-02
timeout 200 python -m pytest -q tests/test_kernels_alrkvd_attention.py 2>&1 | grep -E "Assertion|FAILED|passed|failed" | head
cp kernels/alrkvd_attention.py /tmp/after.py
for round in 1 2; do
  for v in before after; do
    if [ $v = before ]; then cp $D/alrkvd_attention_before_codes.py kernels/alrkvd_attention.py; else cp /tmp/after.py kernels/alrkvd_attention.py; fi
    timeout 100 python benchmarks/bench_attention.py --no-tune --variants alrkvd-r16 alrkvd-rot-r16 alrkvd-rot-mixed \
      --batches 1 8 32 --lengths 4096 32768 --out $OUT/codes_${v}_$round.json 2>&1 | grep alrkvd | sed "s/^/$v $round /"
  done
done
cp /tmp/after.py kernels/alrkvd_attention.py
