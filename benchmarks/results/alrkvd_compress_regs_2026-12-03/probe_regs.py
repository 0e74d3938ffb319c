"""H200 probe: the ALR-KVD compression kernel's registers and spills as the JIT builds it, and one decode step's
compression (`benchmarks/bench_basis.compress_step`: the basis step in PyTorch + the kernel, Qwen3-30B-A3B's 48
layers x 4 kv heads, 1 and 8 blocks per layer) with the kernel's launch as it is and with a register budget
(Triton's `maxnreg`). On the CPU, ptxas 13.4 (triton 3.9) builds the launch as it is with 32 registers and 9.4 KB of
spill stack; with `.maxnreg` 128 or 255 it obeys.

    python benchmarks/results/alrkvd_compress_regs_2026-12-03/probe_regs.py OUT.json  (repo root, H200)"""
import json, sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.bench_basis import compress_step  # noqa: E402
import kernels.alrkvd_compress as ac  # noqa: E402

ARMS = {"as is": {}, "maxnreg 128": {"maxnreg": 128}, "maxnreg 255": {"maxnreg": 255}}


def compiled_kernels():
    """(maxnreg, n_regs, n_spills) of every build of the compression kernel so far."""
    out = []
    for cache in ac._alrkvd_compress_kernel.device_caches.values():
        for part in (c for c in cache if isinstance(c, dict)):
            for k in part.values():
                if hasattr(k, "n_regs"):
                    out.append((getattr(k.metadata, "maxnreg", None), k.n_regs, k.n_spills))
    return sorted(set(out), key=str)


def main():
    default, rows = dict(ac._DEFAULT), []
    for rep in (1, 2):
        for arm, extra in ARMS.items():
            ac._DEFAULT.clear()
            ac._DEFAULT.update(default, **extra)
            for seqs in (1, 8):
                r = dict(compress_step(48, seqs), arm=arm, rep=rep)
                rows.append(r)
                print(f"{rep} {arm:<12} blocks {r['blocks']:4d}  total {r['total_ms']:7.2f} ms  host "
                      f"{r['host_ms']:6.2f} ms", flush=True)
    ac._DEFAULT.clear()
    ac._DEFAULT.update(default)
    builds = compiled_kernels()
    print("builds (maxnreg, registers, spill bytes):", builds)
    Path(sys.argv[1]).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), triton=triton.__version__,
                                                 builds=builds, rows=rows), indent=1))
    for arm in ARMS:
        print(f"{arm:<12} " + "  ".join(
            f"{b} blocks {min(r['total_ms'] for r in rows if r['arm'] == arm and r['blocks'] == b):7.2f} ms"
            for b in (48, 384)))


if __name__ == "__main__":
    main()
