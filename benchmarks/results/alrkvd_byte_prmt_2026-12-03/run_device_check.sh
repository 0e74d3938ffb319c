# Device call 5 (from the repository root): the tree as committed (call 4's kernel for rotated keys; post_rope with
# its stream scales mid-tile again, as in call 3's tree) compiled under the kernel tests; post_rope at B=8 L=32k
# against 5a4a50f.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_byte_prmt_2026-12-03
timeout 110 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py 2>&1 | tail -2 | tee $OUT/kernel_tests.log
timeout 70 python benchmarks/compare_kernels.py --out $OUT/check_r16.json --before $D/alrkvd_attention_before.py \
    --arms before now --shapes 8x32768 --variant alrkvd-r16 2>&1 | grep -v "no tuned" > $OUT/check_r16.log
tail -4 $OUT/check_r16.log
