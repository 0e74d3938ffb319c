# Ran on the tree of commit bf6ceda: check that commit out to measure the same code.
# Device call 4 (from the repository root): the kernel tests compiled (again: call 3's output was cut), then
# capped registers (probe_launch.py caps).
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_int8_residual_2026-12-02
python -c "import torch; p = torch.cuda.get_device_properties(0); print(p.regs_per_multiprocessor, p.shared_memory_per_multiprocessor, p.max_threads_per_multi_processor)"
timeout 150 python -m pytest -q tests/test_kernels_alrkvd_attention.py tests/test_kernels_paged_attention.py 2>&1 | grep -E "Error|FAILED|passed|failed" | head
timeout 300 python $D/probe_launch.py $OUT/maxnreg_h200.json caps 2>&1 | grep -v "no tuned"
