# Does Triton's automatic warp specialization split the ALR-KVD main loop on sm_90? (CPU compile, no GPU; from the
# repository root.) Copies the kernels, marks the main loop `tl.range(..., warp_specialize=True)`, compiles the 2-warp
# and 4-warp launches with benchmarks/sass_count.py and counts `ttg.warp_specialize` in the TTGIR (triton 3.9 here: 0, 0;
# triton 3.6 on the H200, call 6: see call6/ws_check.log).
set -e
ROOT=$PWD; TMP=$(mktemp -d); PY=${PY:-$ROOT/.venv/bin/python}  # PY=python on the device
mkdir -p $TMP/kernels && cp kernels/*.py $TMP/kernels/
sed -i 's/        for t in range(t_start, t_end):/        for t in tl.range(t_start, t_end, warp_specialize=True):/' \
    $TMP/kernels/alrkvd_attention.py
grep -c "warp_specialize=True" $TMP/kernels/alrkvd_attention.py
for w in 2 4; do
  (cd $TMP && rm -f last.ttgir && rc=0 && PYTHONPATH=$TMP $PY $ROOT/benchmarks/sass_count.py kernels.alrkvd_attention \
      _alrkvd_decode_stage1 "dict(ROTATED_KEYS=True, num_warps=$w, WINDOW_N=64)" > log 2>&1 || rc=$?
   [ $rc = 0 ] || { echo "num_warps=$w: the compile failed (exit $rc):"; tail -3 log; }
   [ -f last.ttgir ] && echo "num_warps=$w: $(grep -c 'ttg.warp_specialize' last.ttgir || true) ttg.warp_specialize ops")
done
rm -r $TMP
