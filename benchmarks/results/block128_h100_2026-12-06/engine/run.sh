# blocks of 128 against 64 for the served ALR-KVD preset: decode steps (graphs, 4k), one format a process (H100 memory)
set -u; export PYTHONUNBUFFERED=1 PYTHONPATH=.
t0=$(date +%s)
for f in alrkvd-gpu alrkvd-gpu@block_size=128 fp16; do
  [ $(( $(date +%s) - t0 )) -lt 330 ] || break
  timeout 160 python benchmarks/bench_engine.py --gpu --models qwen3-30b-a3b --batches 1,8,32 --contexts 4096 \
    --kv-formats $f --modes graphs --out $OUT/decode_${f%%@*}_$(( $(date +%s) - t0 )).json 2>&1 | grep -v "Warning\|no tuned" | tail -6
  echo "$f done $(( $(date +%s) - t0 )) s"
done
