# session 47's first call: the Jacobi Ritz solve (one compression graph, no host wait) and blocks of 128 against the
# served ALR-KVD preset under the long-context mix, engine alone; fp16 last. Each arm in its own process.
set -u; export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python .probe/jacobi_time.py 2>&1 | tail -16 | tee $OUT/jacobi_time.txt
timeout 90 python -m pytest -q -x tests/engine/test_cuda_graphs.py -k compression_graphs 2>&1 | tail -3 | tee $OUT/test.txt
echo "tests done $(( $(date +%s) - t0 )) s"
run() {  # arm tag
  timeout 110 python benchmarks/bench_step_mix.py --long --arms $1 --users 16 --steps 150 --warmup 60 \
    --out $OUT/$2.json 2>&1 | grep -v "Warning\|no tuned" | tail -8 | sed "s|^|$2 |" | tee $OUT/$2.txt
  echo "$2 done $(( $(date +%s) - t0 )) s"
}
run alrkvd-gpu:pieces base
run alrkvd-gpu@basis_solver=jacobi:pieces jacobi
run alrkvd-gpu@block_size=128:pieces b128
run alrkvd-gpu@block_size=128+basis_solver=jacobi:pieces b128_jacobi
[ $(( $(date +%s) - t0 )) -lt 470 ] && run fp16 fp16
cat $OUT/*.txt | grep -i "prompt tokens\|tok/s\|summary" | head -20
