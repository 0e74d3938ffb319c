# Writes the kernels that run_device_*.sh time, from the repository root: alrkvd_attention_before.py (the kernel at
# 5a4a50f, this folder's baseline) and each candidate try_*.py (that file with try_*.patch applied). Not committed:
# they travel to the device as untracked files. Call 1's arms now and guard are try_fold.py and try_fold_guard.py.
D=benchmarks/results/alrkvd_byte_prmt_2026-12-03
git show 5a4a50f:kernels/alrkvd_attention.py > $D/alrkvd_attention_before.py
for p in $D/try_*.patch; do patch -s -o "${p%.patch}.py" $D/alrkvd_attention_before.py "$p"; done
