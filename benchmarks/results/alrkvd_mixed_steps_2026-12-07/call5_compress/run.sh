export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python .probe/compress_probe.py 2>&1 | grep -v "no tuned" | tail -25
