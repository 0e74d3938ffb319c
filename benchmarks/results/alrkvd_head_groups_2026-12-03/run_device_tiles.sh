# Device call 3 (from the repository root; ran on the tree of commit c718ff4, whose kernel is c1cea8a's): the per-head kernel
# at 128-token tiles (the basis converted once per block of 128 instead of twice; 38 SASS instructions per warp per
# (token, kv head) at 2 warps against 50 at 64-token tiles, CPU compile for sm_90), against its launch now; then
# issue 4's table with the launch as it stands (scales one tile ahead, biased codes unpacked by inline PTX, the
# 2-warp launch capped at 168 registers at rank <= 16).
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_head_groups_2026-12-03
timeout 300 python $D/probe_groups.py $OUT/probe_tiles_h200.json kernels/alrkvd_attention.py \
    kernels/alrkvd_attention.py before n64-w2-r168 n128-w2 n128-w2-r200 n128-w4 n128-w4-r160 2>&1 \
    | grep -v "no tuned" > $OUT/probe_tiles.log
tail -8 $OUT/probe_tiles.log
timeout 220 python benchmarks/bench_attention.py --no-tune --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 \
    alrkvd-rot-mixed alrkvd-r16 --out $OUT/attention_table_final_h200.json 2>&1 | grep -v "no tuned" \
    > $OUT/attention_table_final.log
grep -E "alrkvd-rot-r16|sdpa|date" $OUT/attention_table_final.log
