# Writes the kernels that run_device_*.sh time, from the repository root: alrkvd_attention_before.py (the kernel at
# faa7d53, this folder's baseline) and try_subtiles.py (that file with try_subtiles.patch applied: the window's
# WINDOW_N, and the per-block work done once a block with 64-token tiles at 168 registers). Not committed: they
# travel to the device as untracked files.
D=benchmarks/results/alrkvd_registers_2026-12-03
git show faa7d53:kernels/alrkvd_attention.py > $D/alrkvd_attention_before.py
patch -s -o $D/try_subtiles.py $D/alrkvd_attention_before.py $D/try_subtiles.patch
# alrkvd_attention_4141e24.py: the kernel at 4141e24 (the window's 64-token tiles), call 6's baseline, and
# try_window_waves.py: that kernel with the split count's waves counting the window's program (try_window_waves.patch)
git show 4141e24:kernels/alrkvd_attention.py > $D/alrkvd_attention_4141e24.py
patch -s -o $D/try_window_waves.py $D/alrkvd_attention_4141e24.py $D/try_window_waves.patch
