# Device call 3 (from the repository root): register caps on the 2-warp launch of this tree's kernel.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_pipeline_2026-12-03
timeout 300 python $D/probe_caps.py $OUT/probe_caps_h200.json 2>&1 | grep -v "no tuned" > $OUT/probe_caps.log
tail -7 $OUT/probe_caps.log
