# Ran on the tree of commit 3e760e3: check that commit out to measure the same code.
# Device call 3 (from the repository root): the kernel tests compiled (the inline-PTX unpacking runs only compiled);
# the probe at 2 stages, before (alrkvd_attention_prefetch.py: the scales loaded one tile ahead, call 2's "after")
# and after (this tree: residual codes biased, unpacked by inline PTX, run weights folded into the query and the
# accumulators); issue 4's table with this tree's kernel.
# Before the call: git show 2636ea9:kernels/alrkvd_attention.py > $D/alrkvd_attention_prefetch.py (change 1 alone;
# not committed, a copy of that commit's file).
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_pipeline_2026-12-03
timeout 150 python -m pytest -q -x tests/test_kernels_alrkvd_attention.py 2>&1 | grep -E "Error|FAILED|passed|failed" | head
timeout 200 python $D/probe_pipeline.py $OUT/probe_unpack_h200.json $D/alrkvd_attention_prefetch.py 2 2>&1 \
    | grep -v "no tuned" > $OUT/probe_unpack.log
tail -8 $OUT/probe_unpack.log
timeout 220 python benchmarks/bench_attention.py --no-tune --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 \
    alrkvd-rot-mixed alrkvd-r16 --out $OUT/attention_table_h200.json 2>&1 | grep -v "no tuned" | grep -E "alrkvd|sdpa|date"
