# Device call 2 (from the repository root): the transposed kernel of call 1 (4 programs per SM: registers) with a
# register cap of 168 (6 per SM, shared memory allows 6), and without Triton's pipeline (num_stages 1: no shared
# buffers), alone and capped at 128 registers; against the kernel of the session's start; rotated keys rank 16.
# (the snapshot is not kept in the repository: git show a4a7ef6:kernels/alrkvd_attention.py > $D/alrkvd_attention_before.py)
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_transposed_2026-12-03
timeout 300 python benchmarks/compare_kernels.py --out $OUT/probe_occupancy.json --before $D/alrkvd_attention_before.py \
    --arms before now r168:maxnreg=168 s1:num_stages=1 s1r128:num_stages=1,maxnreg=128 2>&1 \
    | grep -v "no tuned" > $OUT/probe_occupancy.log
grep "^  8   32768 1" $OUT/probe_occupancy.log; tail -8 $OUT/probe_occupancy.log
