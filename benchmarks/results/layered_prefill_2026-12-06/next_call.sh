# The next call (not run: no device time left in session 48). .probe/base is `git archive e7a775a backend kernels
# benchmarks server` with this commit's bench_step_mix.py. H100/H200: the engine mix, fp16 against layered groups of 8 (HEAD: GEMM rows padded to 64 and warmed) and the
# same layered arm without the padding (.probe/base, e7a775a; the same bench with the engine's warm-up), in turns.
export PYTHONPATH=.
mkdir -p $OUT/mix
here=$(pwd)
start=$(date +%s)
for spec in head:fp16:layered8 base:fp16:layered8 head:fp16 head:fp16:layered4 head:fp16:layered3 head:fp16:layered2; do
  if [ $(( $(date +%s) - start )) -gt 420 ]; then echo "skip $spec (time)"; continue; fi
  tree=${spec%%:*}; arm=${spec#*:}; name=${tree}_${arm//:/_}
  dir=$here; [ $tree = base ] && dir=$here/.probe/base
  (cd $dir && PYTHONPATH=. timeout 140 python benchmarks/bench_step_mix.py --arms $arm --users 8,32 --steps 200 \
     --warmup 30 --out $OUT/mix/$name.json > $OUT/mix/$name.txt 2>&1)
  echo "$name rc=$?"; grep "users" $OUT/mix/$name.txt | cut -c1-330
done
cd $OUT && tar czf mix.tgz mix && rm -rf mix
