"""Launch configurations (tiles, warps, stages) as data, in the manner of vLLM's fused-MoE configs.

A kernel's tuned configurations live in `kernels/configs/<kernel>,device_name=<name>.json`: a JSON
object from a key string (`"head_dim=128,group=4"`, whatever the kernel's launcher builds) to a dict
of launch parameters. Without a file for this device, or without the key in it, the launcher's
default is used and logged once as possibly sub-optimal. `ALRKVD_KERNEL_CONFIG_DIR` is searched first.

Nothing here runs at import.
"""
from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def device_name(device: torch.device) -> str:
    """The name used in config file names: `NVIDIA_H200`, or `cpu` (the interpreter)."""
    if device.type != "cuda":
        return "cpu"
    return torch.cuda.get_device_name(device).replace(" ", "_")


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 4 for the CPU interpreter (keeps grids small)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def resident_programs(kernel, device: torch.device) -> int:
    """Programs of a compiled Triton kernel that the GPU runs at once: per SM the fewest that its registers
    (allocated per warp in steps of 8 a thread), shared memory (1 KB reserved per program) and threads allow, as
    Triton's fused-softmax tutorial counts them, times the SMs."""
    props = torch.cuda.get_device_properties(device)
    kernel._init_handles()  # loads the binary: n_regs
    warps = kernel.metadata.num_warps
    per_sm = min(props.regs_per_multiprocessor // (-(-kernel.n_regs // 8) * 8 * 32 * warps),
                 props.shared_memory_per_multiprocessor // (kernel.metadata.shared + 1024),
                 props.max_threads_per_multi_processor // (32 * warps))
    return max(1, per_sm) * props.multi_processor_count


def config_path(folder: Path, kernel: str, dev_name: str) -> Path:
    return Path(folder) / f"{kernel},device_name={dev_name}.json"


def save_configs(folder: Path, kernel: str, dev_name: str, configs: dict) -> Path:
    """Add `configs` (key -> launch parameters) to the kernel's file for this device in `folder` (the tuners'
    output); keys already there and not in `configs` stay. Returns the file's path."""
    path = config_path(folder, kernel, dev_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**existing, **configs}, indent=1, sort_keys=True) + "\n")
    return path


@functools.lru_cache(maxsize=None)
def _load_configs(kernel: str, dev_name: str) -> dict:
    dirs = [Path(p) for p in [os.environ.get("ALRKVD_KERNEL_CONFIG_DIR")] if p] + [CONFIG_DIR]
    for folder in dirs:
        path = config_path(folder, kernel, dev_name)
        if path.is_file():
            with open(path) as f:
                return json.load(f)
    return {}


@functools.lru_cache(maxsize=None)
def _warn_default(kernel: str, dev_name: str, key: str) -> None:
    logger.warning("no tuned config for %s on %s (%s): using the default, possibly sub-optimal",
                   kernel, dev_name, key)


def get_config(kernel: str, key: str, device: torch.device, default: dict) -> dict:
    """The launch parameters of `kernel` for `key` on `device`: tuned from JSON, else `default`."""
    dev_name = device_name(device)
    tuned = _load_configs(kernel, dev_name).get(key)
    if tuned is None:
        if device.type == "cuda":
            _warn_default(kernel, dev_name, key)
        return dict(default)
    return {**default, **tuned}
