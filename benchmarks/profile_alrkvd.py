"""Profile the ALR-KVD decode kernel on the GPU with Nsight Compute: where its warps stall.

Builds the benchmark's synthetic cache (benchmarks/bench_attention.py, rank 16, B=8, L=32k by default),
runs the kernel a few times, and (with --ncu) re-runs itself under `ncu` for one launch of stage 1,
writing the report and its text pages (details, SASS source with stall samples) to --out-dir.

    python benchmarks/profile_alrkvd.py --ncu --out-dir $OUT/prof      # H200, ~1-2 min
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run_kernel(batch: int, length: int, variant: str, calls: int) -> None:
    import torch
    from benchmarks.bench_attention import HEAD_DIM, NUM_KV_HEADS, NUM_Q_HEADS, ALRKVD_BLOCK, VARIANTS, make_alrkvd
    from kernels.alrkvd_attention import alrkvd_decode_attention
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    kwargs, _ = make_alrkvd(batch, length, NUM_KV_HEADS, HEAD_DIM, ALRKVD_BLOCK, *VARIANTS[variant], "cuda", gen)
    q = torch.randn(batch, NUM_Q_HEADS, HEAD_DIM, device="cuda", dtype=torch.float16)
    for _ in range(calls):
        alrkvd_decode_attention(q, scale=HEAD_DIM ** -0.5, **kwargs)
    torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=32768)
    ap.add_argument("--variant", default="alrkvd-r16")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--ncu", action="store_true", help="re-run under ncu and write its report")
    ap.add_argument("--out-dir", default="reports/profile_alrkvd")
    args = ap.parse_args()
    if not args.ncu:
        run_kernel(args.batch, args.length, args.variant, args.calls)
        return 0
    ncu = shutil.which("ncu") or next(iter(sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"))), None)
    if ncu is None:
        raise SystemExit("ncu not found")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rep = out / "stage1"
    me = [sys.executable, __file__, "--batch", str(args.batch), "--length", str(args.length),
          "--variant", args.variant, "--calls", str(args.calls)]
    subprocess.run([str(ncu), "--clock-control", "none", "--kernel-name", "regex:alrkvd_decode_stage1",
                    "--launch-skip", "1", "--launch-count", "1", "--set", "full", "--import-source", "yes",
                    "-f", "-o", str(rep), *me], check=True, env=os.environ)
    for page, name in (("details", "details.txt"), ("source", "source_sass.csv")):
        extra = ["--csv", "--print-source", "sass"] if page == "source" else []
        text = subprocess.run([str(ncu), "-i", f"{rep}.ncu-rep", "--page", page, *extra],
                              capture_output=True, text=True)
        (out / name).write_text(text.stdout + text.stderr)
    print((out / "details.txt").read_text()[:6000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
