"""H200 probe: the rotated ALR-KVD kernel (rank 16) before and after its scales were loaded one tile ahead, at 2, 3
and 4 pipeline stages of the main loop ("before" is alrkvd_attention_before.py: git show 7f8e501:kernels/alrkvd_attention.py, the kernel at the session's start;
"after" is kernels/alrkvd_attention.py). Each shape runs every (kernel, stages) pair twice, alternated; splits from
the dispatcher (whole waves of the programs the compiled kernel lets run at once). Also prints, per pair, what the
compiler made of the main loop on this machine's Triton: registers, spills, shared memory, async copies.

    python benchmarks/results/alrkvd_pipeline_2026-12-03/probe_pipeline.py OUT.json [BEFORE.py [STAGES]]  (repo root,
        H200; BEFORE.py defaults to alrkvd_attention_before.py beside this script, STAGES to 2,3,4)

Same data and timing as benchmarks/bench_attention.py; SDPA timed per shape in the same run."""
import importlib.util, json, re, sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from benchmarks import bench_attention as ba  # noqa: E402
import kernels.alrkvd_attention as after  # noqa: E402
import kernels.paged_attention as pa  # noqa: E402


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


SHAPES = [(1, 4096), (1, 32768), (8, 4096), (8, 32768), (32, 32768), (8, 131072)]
if not torch.cuda.is_available():  # a smoke run of this script (TRITON_INTERPRET=1)
    SHAPES = [(1, 384)]
STAGES = tuple(int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "2,3,4").split(","))


def compiled_summary(mod, q, kw, scale) -> dict:
    """Compile stage 1 as the dispatcher would launch it and read its resources and main-loop copies."""
    cfg = mod._stage1_config(q, kw["cache"])
    min_tokens = cfg.pop("MIN_TOKENS_PER_SPLIT")
    B, Hq, D = q.shape
    parts = (torch.empty(B, Hq, 3, D, device=q.device), torch.empty(B, Hq, 3, device=q.device),
             torch.empty_like(q))
    k = mod._alrkvd_stage1(q, kw["cache"], kw["window_k"], kw["window_v"], kw["block_tables"], kw["seq_lens"],
                           kw["window_slots"], kw["cos"], kw["sin"], scale, *parts,
                           pa.decode_tickets(None, B * kw["cache"].num_kv_heads, q.device), cfg, min_tokens,
                           warmup=True)
    ttgir = k.asm["ttgir"]
    k._init_handles()  # loads the binary: n_regs, n_spills
    return dict(regs=k.n_regs, spills=k.n_spills, shared=k.metadata.shared, warps=k.metadata.num_warps,
                async_copies=ttgir.count("async_copy_global_to_local"),
                waits=re.findall(r"async_wait[^\n]*?num = (\d+)", ttgir))


def main():
    dev, gen = ("cuda" if torch.cuda.is_available() else "cpu"), torch.Generator().manual_seed(0)
    H, Hq, D, T = ba.NUM_KV_HEADS, ba.NUM_Q_HEADS, ba.HEAD_DIM, ba.ALRKVD_BLOCK
    scale, rows, compiled = D ** -0.5, [], {}
    before = load_module(Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "alrkvd_attention_before.py",
                         "alrkvd_attention_before")
    kernels = {"before": before, "after": after}
    defaults = {name: dict(m._DEFAULT_STAGE1) for name, m in kernels.items()}
    for B, L in SHAPES:
        kv_bytes = 2 * B * H * L * D * 2
        data = [(torch.randn(B, Hq, 1, D, device=dev, dtype=torch.float16),
                 torch.randn(B, H, L, D, device=dev, dtype=torch.float16),
                 torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(ba.num_copies(kv_bytes, dev))]
        sdpa = ba.time_calls([ba.sdpa_call(*d) for d in data], dev) * 1e6
        del data
        torch.cuda.empty_cache()
        make = lambda: ba.make_alrkvd(B, L, H, D, T, *ba.VARIANTS["alrkvd-rot-r16"], dev, gen)
        first, nbytes = make()
        layers = [first] + [make()[0] for _ in range(ba.num_copies(nbytes, dev) - 1)]
        q = torch.randn(B, Hq, D, device=dev, dtype=torch.float16)
        for rep in (1, 2):
            for stages in STAGES:
                for name, mod in kernels.items():
                    mod._DEFAULT_STAGE1.clear()
                    mod._DEFAULT_STAGE1.update(defaults[name], num_stages=stages)
                    pa._RESIDENT.clear()  # the two modules share the dispatcher's cache keys
                    key = (name, stages, B * H >= after.MANY_PAIRS)
                    if key not in compiled and dev == "cuda":
                        compiled[key] = compiled_summary(mod, q, first, scale)
                        print(key, compiled[key], flush=True)
                    err = ba.check_decode_kernel(mod.alrkvd_decode_attention, mod.alrkvd_decode_attention_ref, q,
                                                 scale, **first)[1] if rep == 1 and B * L <= 32768 else {}
                    us = ba.time_calls([lambda kw=kw: mod.alrkvd_decode_attention(q, scale=scale, **kw)
                                        for kw in layers], dev) * 1e6
                    r = dict(B=B, L=L, rep=rep, kernel=name, stages=stages, us=us, sdpa_us=sdpa, vs_sdpa=sdpa / us,
                             resident=sorted(set(pa._RESIDENT.values())), **err)
                    rows.append(r)
                    print(f"{B:>3} {L:>7} {rep} {name:<6} stages {stages} resident {r['resident']} {us:9.1f} us "
                          f"vs sdpa {sdpa / us:.2f} {err.get('check_ok', '')}", flush=True)
        del layers, first
        torch.cuda.empty_cache()
    for name, mod in kernels.items():
        mod._DEFAULT_STAGE1.clear()
        mod._DEFAULT_STAGE1.update(defaults[name])
    Path(sys.argv[1]).write_text(json.dumps(dict(
        device=torch.cuda.get_device_name() if dev == "cuda" else dev, triton=__import__("triton").__version__, rows=rows,
        compiled={f"{k[0]} stages {k[1]} {'many' if k[2] else 'few'} pairs": v for k, v in compiled.items()}),
        indent=1))
    print("\nus (best of two), rank 16 rotated")
    print(f"{'B':>3} {'L':>7} {'sdpa':>8} " + " ".join(f"{n[:3]}{s:>6}" for s in STAGES for n in kernels))
    for B, L in SHAPES:
        cells = [min(r["us"] for r in rows if (r["B"], r["L"], r["kernel"], r["stages"]) == (B, L, n, s))
                 for s in STAGES for n in kernels]
        sd = next(r["sdpa_us"] for r in rows if (r["B"], r["L"]) == (B, L))
        print(f"{B:>3} {L:>7} {sd:8.1f} " + " ".join(f"{c:9.1f}" for c in cells))


if __name__ == "__main__":
    main()
