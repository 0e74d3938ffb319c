"""Pick the value rotation's Hadamard signs on WikiText-2 validation (never the test text): k4 v2 block 64."""
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import torch
from argparse import Namespace
from backend.evaluate import load_engine, load_text_ids, perplexity, set_cache
from backend.kv_formats.codecs import rotation_matrix
import backend.kv_cache as kvc
torch.set_num_threads(1)
eng = load_engine(Namespace(model="default", device="cpu", dtype="auto", chunk=128))
ids = load_text_ids(eng, "data/wikitext-2-valid/valid.txt", 16384)
C = dict(block_size=64, rank_budget=8, k_bits=4, v_bits=2, key_frame="rotated", codebook="uniform", rotate=0,
         basis_solver="subspace", rank_max=16, rotate_values=1)
for seed in map(int, sys.argv[1:]):
    kvc.VALUE_ROTATION_SEED = seed
    t = time.time()
    set_cache(eng, "alrkvd", dict(C), 2048)
    res = perplexity(eng, ids, 2048, 128)
    print(json.dumps({"seed": seed, "ppl": res["ppl"], "tokens": res["tokens"], "seconds": round(time.time() - t)}), flush=True)
