# H100, session 54, the same tree as call3; reports/gpu_repository as in call1/run.sh
source .device/setup.sh && export PYTHONPATH=.
bash loadtest/gpu_serving.sh $OUT/s 32 20s "qwen3_30b_alrkvd qwen3_30b_alrkvd_g512"
