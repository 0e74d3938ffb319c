# Device call 2 (from the repository root): issue 4's table, every ALR-KVD variant with its low-rank keys before RoPE
# (alrkvd-*) and with the whole key after RoPE (alrkvd-rot-*), SDPA and the paged fp16 kernel in the same run.
export PYTHONPATH=.
timeout 570 python benchmarks/bench_attention.py --no-tune --variants alrkvd-r16 alrkvd-rot-r16 alrkvd-r32 \
    alrkvd-rot-r32 alrkvd-r64 alrkvd-rot-r64 alrkvd-mixed alrkvd-rot-mixed --out $OUT/attention_table_h200.json 2>&1 \
    | grep -v "no tuned"
