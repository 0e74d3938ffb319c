# run a bench with PagedKVCache.COMPRESS_CHUNK set from $CHUNK (a probe: blocks per compression call)
import os, runpy, sys
import torch
import backend.kv_cache as kc
kc.PagedKVCache.COMPRESS_CHUNK = int(os.environ["CHUNK"])
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    if torch.cuda.is_available():
        print(f"chunk {os.environ['CHUNK']}: peak allocated {torch.cuda.max_memory_allocated() / 1e9:.2f} GB")
