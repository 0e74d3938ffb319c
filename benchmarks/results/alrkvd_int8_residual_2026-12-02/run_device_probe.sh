# Ran on the tree of commit f72bbc0 with this folder added; the probe loads the kernel it measured from alrkvd_attention_before.py.
# Device call 1 (from the repository root): the int8-residual prototype against the repository's kernel and SDPA,
# and split counts at B=8 L=32k (probe_int8.py).
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_int8_residual_2026-12-02
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 420 python $D/probe_int8.py $OUT/probe_int8_h200.json 2>&1 | grep -v "^{" | grep -v "no tuned" | tail -60
