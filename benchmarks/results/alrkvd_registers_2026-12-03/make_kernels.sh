# Writes the kernels that run_device_*.sh time, from the repository root: alrkvd_attention_before.py (the kernel at
# faa7d53, this folder's baseline) and try_subtiles.py (that file with try_subtiles.patch applied: the window's
# WINDOW_N, and the per-block work done once a block with 64-token tiles at 168 registers). Not committed: they
# travel to the device as untracked files.
D=benchmarks/results/alrkvd_registers_2026-12-03
git show faa7d53:kernels/alrkvd_attention.py > $D/alrkvd_attention_before.py
patch -s -o $D/try_subtiles.py $D/alrkvd_attention_before.py $D/try_subtiles.patch
