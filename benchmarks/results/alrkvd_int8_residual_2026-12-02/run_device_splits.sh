# Ran on the tree of commit f72bbc0 with this folder added; the probe loads the kernel it measured from alrkvd_attention_before.py.
# Device call 2 (from the repository root): split counts per shape and the compiled registers (probe_splits.py).
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_int8_residual_2026-12-02
timeout 500 python $D/probe_splits.py $OUT/splits_h200.json 2>&1 | grep -v "no tuned"
