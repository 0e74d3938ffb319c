# H100, session 54, the same tree as call3
source .device/setup.sh && export PYTHONPATH=.
python benchmarks/bench_step_mix.py --arms alrkvd-gpu:layered8:graphs512:apart,alrkvd-gpu:layered8:graphs512 --users 32 --steps 120 --warmup 30 --out $OUT/mix_g512_apart.json
