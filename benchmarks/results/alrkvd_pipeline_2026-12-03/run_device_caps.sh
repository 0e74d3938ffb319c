# Ran on the tree of commit 622f7fc: check that commit out to measure the same code.
# Device call 4 (from the repository root): register caps on the 2-warp launch of this tree's kernel.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_pipeline_2026-12-03
timeout 300 python $D/probe_caps.py $OUT/probe_caps_h200.json 2>&1 | grep -v "no tuned" > $OUT/probe_caps.log
tail -7 $OUT/probe_caps.log
