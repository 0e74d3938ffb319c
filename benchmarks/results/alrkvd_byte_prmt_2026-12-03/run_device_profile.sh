# Device call 2 (from the repository root): the tree (the byte codes by one prmt per pair) compiled under the kernel
# tests, then Nsight Compute on one stage-1 launch at B=8 L=32k, rotated keys rank 16: the details page, the SASS
# source page with stall samples, and the page by source line (the kernel's Python lines) for stalls by line.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_byte_prmt_2026-12-03
timeout 110 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py 2>&1 | tail -25 | tee $OUT/kernel_tests.log
timeout 300 python benchmarks/profile_alrkvd.py --ncu --variant alrkvd-rot-r16 --out-dir $OUT/prof > $OUT/prof.log 2>&1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for src in cuda "cuda,sass"; do
  timeout 60 $NCU -i $OUT/prof/stage1.ncu-rep --page source --csv --print-source $src > "$OUT/prof/source_$src.csv" 2>&1
  head -c 400 "$OUT/prof/source_$src.csv"; echo
done
python $D/../alrkvd_one_warp_2026-12-03/prof/stalls.py $OUT/prof/source_sass.csv > $OUT/prof/stalls.txt 2>&1
head -30 $OUT/prof/stalls.txt; grep -E "Duration|Registers|Achieved Occupancy|Issue Slots Busy" $OUT/prof/details.txt | head
