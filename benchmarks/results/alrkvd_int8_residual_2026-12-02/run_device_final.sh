# Ran on the tree of commit bf6ceda: check that commit out to measure the same code.
# Device call 3 (from the repository root): the kernel tests compiled; the table before (alrkvd_attention_before.py:
# the kernel at the session's start) and after (this tree: window loop not pipelined, splits from whole waves),
# alternated; the end-to-end step at B=8, 32k.
export PYTHONPATH=. ; D=benchmarks/results/alrkvd_int8_residual_2026-12-02
python -c "import torch; p = torch.cuda.get_device_properties(0); print(p.regs_per_multiprocessor, p.shared_memory_per_multiprocessor, p.max_threads_per_multi_processor)"
timeout 150 python -m pytest -q tests/test_kernels_alrkvd_attention.py tests/test_kernels_paged_attention.py 2>&1 | grep -E "Error|FAILED|passed|failed" | head
cp kernels/alrkvd_attention.py /tmp/after.py
run() {  # $1 before|after, $2 tag, rest: bench_attention arguments
  if [ $1 = before ]; then cp $D/alrkvd_attention_before.py kernels/alrkvd_attention.py; else cp /tmp/after.py kernels/alrkvd_attention.py; fi
  local v=$1 tag=$2; shift 2
  timeout 200 python benchmarks/bench_attention.py --no-tune "$@" --out $OUT/table_${v}_$tag.json 2>&1 | grep -E "alrkvd|sdpa" | sed "s/^/$v $tag /"
}
run before 1 --variants alrkvd-rot-r16 alrkvd-rot-mixed
run after 1 --variants alrkvd-rot-r16 alrkvd-rot-r32 alrkvd-rot-r64 alrkvd-rot-mixed
run before 2 --variants alrkvd-rot-r16 --batches 8 32 --lengths 32768
run after 2 --variants alrkvd-rot-r16 --batches 8 32 --lengths 32768
cp /tmp/after.py kernels/alrkvd_attention.py
timeout 130 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 8 --contexts 32768 \
    --kv-formats fp16,alrkvd-rotated --modes graphs --steps 20 --out $OUT/engine_e2e_h200.json 2>&1 | tail -6
