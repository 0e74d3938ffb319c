"""Copies between the host and a CUDA device queued on the stream without waiting for the GPU: a step's inputs go
up and its tokens come down while the work queued before them runs (`EngineArgs.async_scheduling` queues the next
step before the last one's tokens are read)."""
from __future__ import annotations

import torch


def queued_copy(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """`dst.copy_(src)` from a host tensor, queued on a CUDA device through pinned memory: from pageable memory the
    copy waits for the work queued before it, so a step queued behind another (`EngineArgs.async_scheduling`) would
    wait for that one to finish."""
    return dst.copy_(src.pin_memory() if dst.is_cuda and not src.is_cuda else src, non_blocking=True)


def queued_tensor(src: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on `device`, copied as `queued_copy` copies."""
    return queued_copy(torch.empty_like(src, device=device), src)


class QueuedRead:
    """A device tensor copied to the host behind the work queued before it, without waiting (pinned memory and an
    event): `tolist()` then waits for that work only. The tensor's own `tolist()` would queue its copy last and so
    wait for the next step too, when that is queued before this one's tokens are read (`async_scheduling`)."""

    def __init__(self, src: torch.Tensor):
        self.host, self.done = src, None
        if src.is_cuda:
            self.host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True).copy_(src, non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record()

    def ready(self) -> bool:
        """The copy has landed (no wait)."""
        return self.done is None or self.done.query()

    def tolist(self) -> list:
        if self.done is not None:
            self.done.synchronize()
        return self.host.tolist()
