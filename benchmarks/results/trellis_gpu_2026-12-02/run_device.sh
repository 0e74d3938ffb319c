# Device call 1 (carry .device, .whl; call 2 carries reports/gguf1 alone: 64 MiB a call): the Viterbi kernel against the CPU reference, the block
# encode time (gauss against trellis, both state sizes); installs gguf for the quality runs of call 2.
# From the repo root: source .device/setup.sh && bash benchmarks/results/trellis_gpu_2026-12-02/run_device.sh
D=benchmarks/results/trellis_gpu_2026-12-02
export PYTHONPATH=.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
nvidia-smi --query-gpu=name --format=csv,noheader
python3 $D/viterbi_check.py 4096 2>&1 | tee $OUT/viterbi_check.txt
python3 $D/encode_time.py 1 cuda 2>&1 | tee $OUT/encode_time.txt
