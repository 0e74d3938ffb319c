# H100, session 54, HEAD eee08f6 + bench_mixed_attention.py's eager capture (as committed)
source .device/setup.sh && export PYTHONPATH=.
python benchmarks/bench_mixed_attention.py --arms fp16,alrkvd-gpu,alrkvd-gpu:apart --contexts 226,1024,4096 --out $OUT/mixed_attention.json
python benchmarks/bench_step_mix.py --long --arms alrkvd-gpu,alrkvd-gpu:apart --users 16 --steps 80 --warmup 30 --out $OUT/mix_apart_long.json
# (`:apart` then set rows_apart to max_num_seqs; since 37b it is the default and `:tiles` the arm without it)
