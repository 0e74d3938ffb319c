# H100, session 54, the same tree as call3
source .device/setup.sh && export PYTHONPATH=.
python benchmarks/bench_step_mix.py --long --arms alrkvd-gpu:apart,alrkvd-gpu --users 16 --steps 120 --warmup 40 --out $OUT/mix_apart_long2.json
python benchmarks/tune_fused_moe.py --tokens 2048 --out-dir $OUT/cfg --report $OUT/tune.json
for arm in default tuned; do [ $arm = tuned ] && export ALRKVD_KERNEL_CONFIG_DIR=$OUT/cfg
  python benchmarks/profile_mixed_step.py --batch 0 --tokens 2048 --context 0 --graphs --out $OUT/p2048_$arm.json; done
