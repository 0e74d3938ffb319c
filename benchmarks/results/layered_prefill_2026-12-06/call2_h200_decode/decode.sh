# Decode steps at 4k, fp16, graphs: the code before the routing-laid-out pairs (.probe/base) and HEAD, in turns.
mkdir -p $OUT/dec
here=$(pwd)
for round in 1 2; do
  for arm in base head; do
    dir=$here; [ $arm = base ] && dir=$here/.probe/base
    (cd $dir && PYTHONPATH=. timeout 150 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 1,8 \
      --contexts 4096 --kv-formats fp16 --modes graphs --steps 20 --out $OUT/dec/${arm}_$round.json \
      > $OUT/dec/${arm}_$round.txt 2>&1)
    echo "$arm $round rc=$?"; grep -i "ms" $OUT/dec/${arm}_$round.txt | grep -v tuned | tail -4 | cut -c1-300
  done
done
