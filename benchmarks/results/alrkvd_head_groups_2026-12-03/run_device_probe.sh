# Device call 1 (from the repository root): the kernel tests compiled, then kv heads per program against the kernel
# before (before.py: `git show c1cea8a:kernels/alrkvd_attention.py`).
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_head_groups_2026-12-03
timeout 200 python -m pytest -q tests/test_kernels_alrkvd_attention.py -k "format_options" 2>&1 | grep -E "^E|passed|failed" | head -12
timeout 380 python $D/probe_groups.py $OUT/probe_groups_h200.json $D/before.py 2>&1 | grep -v "no tuned" > $OUT/probe_groups.log
tail -9 $OUT/probe_groups.log
