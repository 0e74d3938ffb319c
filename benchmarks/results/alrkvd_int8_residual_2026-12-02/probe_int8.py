"""H200 probe: the int8-residual prototype (written by make_prototype.py) against the repository's kernel as it was
then (alrkvd_attention_before.py, "repo") and FP16 SDPA in one process; then both at several split counts.

    python benchmarks/results/alrkvd_int8_residual_2026-12-02/probe_int8.py OUT.json      (repo root, H200)

Same data and timing as benchmarks/bench_attention.py (random codes, CUDA-graph replays over copies larger than
L2, 32 query / 8 kv heads, head_dim 128, block 128, 2-bit residual, rotated keys). The prototype reads the value
residual tokens-contiguous: the same bytes, copied to [blocks, H, NB, T] and viewed back as [blocks, T, H, NB]."""
import dataclasses, json, sys, tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from benchmarks import bench_attention as ba  # noqa: E402
from kernels.testing import check_decode_kernel  # noqa: E402
from benchmarks.devices import copy_bandwidth  # noqa: E402
sys.path.insert(0, str(HERE))
from make_prototype import load_module, write_prototype  # noqa: E402

before = load_module("alrkvd_before", HERE / "alrkvd_attention_before.py")
alrkvd_decode_attention, alrkvd_decode_attention_ref = before.alrkvd_decode_attention, before.alrkvd_decode_attention_ref
proto_path = Path(tempfile.mkdtemp()) / "alrkvd_int8.py"
write_prototype(proto_path)
proto = load_module("alrkvd_int8", proto_path)


def tokens_contiguous(kw):
    v = kw["cache"].v_resid  # [nb, T, H, NB]
    vt = v.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)  # same values, tokens contiguous in memory
    return dict(kw, cache=dataclasses.replace(kw["cache"], v_resid=vt))


def main():
    out_path = sys.argv[1]
    dev, gen = "cuda", torch.Generator().manual_seed(0)
    H, Hq, D, T = ba.NUM_KV_HEADS, ba.NUM_Q_HEADS, ba.HEAD_DIM, ba.ALRKVD_BLOCK
    scale = D ** -0.5
    bw = copy_bandwidth(dev)
    rows = []

    def rec(**r):
        rows.append(r)
        print(json.dumps(r), flush=True)

    for B, L in [(1, 4096), (8, 4096), (8, 32768), (32, 32768), (8, 131072)]:
        kv_bytes = 2 * B * H * L * D * 2
        data = [(torch.randn(B, Hq, 1, D, device=dev, dtype=torch.float16),
                 torch.randn(B, H, L, D, device=dev, dtype=torch.float16),
                 torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(ba.num_copies(kv_bytes, dev))]
        sdpa = ba.time_calls([ba.sdpa_call(*d) for d in data], dev)
        del data
        torch.cuda.empty_cache()
        rec(B=B, L=L, method="sdpa", us=sdpa * 1e6)
        for ranks in ("r16", "mixed"):
            make = lambda: ba.make_alrkvd(B, L, H, D, T, *ba.VARIANTS[f"alrkvd-rot-{ranks}"], dev, gen)
            first, nbytes = make()
            layers = [first] + [make()[0] for _ in range(ba.num_copies(nbytes, dev) - 1)]
            q = torch.randn(B, Hq, D, device=dev, dtype=torch.float16)
            layers8 = [tokens_contiguous(kw) for kw in layers]
            for name, kernel, ls in (("repo", alrkvd_decode_attention, layers), ("int8", proto.alrkvd_decode_attention, layers8),
                                     ("repo", alrkvd_decode_attention, layers), ("int8", proto.alrkvd_decode_attention, layers8)):
                extra = {}
                if B * L <= 4096:
                    extra = check_decode_kernel(kernel, alrkvd_decode_attention_ref, q, scale, **ls[0])[1]
                us = ba.time_calls([lambda kw=kw: kernel(q, scale=scale, **kw) for kw in ls], dev) * 1e6
                rec(B=B, L=L, method=f"{name}-{ranks}", us=us, vs_sdpa=sdpa * 1e6 / us,
                    frac_copy=nbytes / (us * 1e-6) / bw, **extra)
            if (B, L) == (8, 32768) and ranks == "r16":
                for splits in (4, 8, 9, 12, 16, 24, 33, 48, 64):
                    for name, kernel, ls in (("repo", alrkvd_decode_attention, layers), ("int8", proto.alrkvd_decode_attention, layers8)):
                        us = ba.time_calls([lambda kw=kw: kernel(q, scale=scale, num_splits=splits, **kw) for kw in ls], dev) * 1e6
                        rec(B=B, L=L, method=f"{name}-{ranks}-splits{splits}", us=us, vs_sdpa=sdpa * 1e6 / us)
            del layers, layers8, first
            torch.cuda.empty_cache()
    Path(out_path).write_text(json.dumps(dict(copy_GBps=bw / 1e9, device=torch.cuda.get_device_name(),
                                              triton=__import__("triton").__version__, rows=rows), indent=1))
    print(f"\n{'B':>3} {'L':>7} {'method':<22} {'us':>9} {'vs sdpa':>8}")
    for r in rows:
        print(f"{r['B']:>3} {r['L']:>7} {r['method']:<22} {r['us']:>9.1f} {r.get('vs_sdpa', 1):>8.2f} "
              f"{r.get('max_err_vs_ref', ''):>10} {r.get('budget', '')}")


if __name__ == "__main__":
    main()
