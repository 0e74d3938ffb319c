# Device call 6 (from the repository root): ws_check.sh with the H200's triton (3.6).
PY=python bash benchmarks/results/alrkvd_ceiling_2026-12-03/ws_check.sh 2>&1 | tee $OUT/ws_check.log
python -c "import triton; print('triton', triton.__version__)" | tee -a $OUT/ws_check.log
