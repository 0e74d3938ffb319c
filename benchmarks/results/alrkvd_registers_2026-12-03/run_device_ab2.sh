# Device call 2 (from the repository root): the tree (window tiles of 32 tokens only in the 2-warp launch:
# WINDOW_N_MANY_PAIRS; call 1 had them in every launch, and B=1 L=4k took 20.1 against 13.3 us) under the kernel
# tests compiled, then against faa7d53 (before) at short and middle contexts, where call 1 found the 2-warp launch
# faster with the 32-token window tiles (B=8 L=4k 43.6 -> 40.0 us) and faster still under maxnreg 168 (32.6 us),
# but slower at L >= 32k (B=8 L=32k 148.4 against 138.3): window tiles of 64 (w64), caps of 168 and 128 registers.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_registers_2026-12-03
timeout 110 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py 2>&1 | tail -2 | tee $OUT/kernel_tests.log
timeout 400 python benchmarks/compare_kernels.py --out $OUT/ab2.json --before $D/alrkvd_attention_before.py \
    --arms before now w64:WINDOW_N_MANY_PAIRS=64 r168:maxnreg=168 r128:maxnreg=128 \
    --shapes 8x4096 8x8192 8x16384 16x4096 32x4096 32x8192 4x4096 1x4096 8x32768 2>&1 | grep -v "no tuned" > $OUT/ab2.log
tail -12 $OUT/ab2.log
