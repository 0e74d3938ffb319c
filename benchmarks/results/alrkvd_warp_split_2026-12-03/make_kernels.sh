# Writes the kernels that run_device_*.sh time, from the repository root: alrkvd_attention_before.py (the kernel at
# a70f2f4, this folder's baseline) and each candidate try_*.py (that file with try_*.patch applied). Not committed:
# they travel to the device as untracked files.
D=benchmarks/results/alrkvd_warp_split_2026-12-03
git show a70f2f4:kernels/alrkvd_attention.py > $D/alrkvd_attention_before.py
for p in $D/try_*.patch; do patch -s -o "${p%.patch}.py" $D/alrkvd_attention_before.py "$p"; done
