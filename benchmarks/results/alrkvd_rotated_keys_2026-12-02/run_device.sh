# Device call 1 (from the repository root): key_frame=rotated (the whole key compressed after RoPE) in the ALR-KVD
# decode kernel. The kernel and compression tests compiled; the launch configurations swept for the rotated kernel
# at B=8 L=32k and B=1 L=4k; then both kernels against SDPA at those shapes with the shipped configuration.
export PYTHONPATH=.
timeout 240 python -m pytest -q tests/test_kernels_alrkvd_attention.py tests/test_kernels_alrkvd_compress.py 2>&1 \
    | grep -E "Assertion|FAILED|passed|failed" | head
timeout 150 python benchmarks/bench_attention.py --tune --tune-variant alrkvd-rot-r16 --tune-shapes 8x32768 1x4096 \
    --variants alrkvd-rot-r16 --batches 1 --lengths 4096 --out $OUT/tune_rot_h200.json 2>&1 | grep -E "^tune|alrkvd|sdpa"
timeout 150 python benchmarks/bench_attention.py --no-tune --variants alrkvd-r16 alrkvd-rot-r16 alrkvd-mixed \
    alrkvd-rot-mixed --batches 1 8 --lengths 4096 32768 --out $OUT/attention_rot_h200.json 2>&1 | grep -v "no tuned"
