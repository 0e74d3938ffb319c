# Session 53, call A: issue 33's served figures on the named machine (both caches, layered groups of 8 as graphs),
# then the decode step at B=8 32k against its roofline and a 2,048-token chunk's profile.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/s
timeout 330 bash loadtest/gpu_serving.sh $OUT/s 1,8,32 20s "qwen3_30b qwen3_30b_alrkvd"
for m in qwen3_30b qwen3_30b_alrkvd; do echo "== $m"; grep -A5 "^| users | requests" $OUT/s/$m/report.md; done
rm -f $OUT/s/*/*.png
timeout 150 python benchmarks/bench_engine.py --gpu --batches 8 --contexts 32768 --kv-formats fp16 --modes graphs \
  --steps 20 --out $OUT/decode_b8_32k.json > $OUT/decode_b8_32k.txt 2>&1
echo "== decode rc=$?"; grep -v "no tuned" $OUT/decode_b8_32k.txt | tail -8 | cut -c1-200
timeout 100 python benchmarks/profile_mixed_step.py --batch 0 --tokens 2048 --context 0 --graphs \
  --out $OUT/p2048_0.json > $OUT/p2048_0.txt 2>&1
echo "== p2048 rc=$?"; grep -v "no tuned" $OUT/p2048_0.txt | head -24 | cut -c1-160
