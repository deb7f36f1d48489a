"""How a forward pass's results come back from a CUDA device without a core spinning for them.

A ``.cpu()`` of a CUDA tensor waits for the work queued before it. By default CUDA waits by
spinning a host core whenever the process has fewer CUDA contexts than the machine has cores
(``cudaDeviceScheduleAuto``): the caller's core is 100% busy for the whole pass. The GPU box
of 2026-11-26 shows it in the tuner's profile, a CUDA pass's CPU seconds equal to its wall
seconds at every batch size (0.72 ms of CPU for a 0.70 ms pass of 64 Pong frames). Collection
fills the cores with env workers, so a core that spins while the device works is one env
worker fewer: an actor or a replica process of an overlapped loop, or of several actors,
spins while another's envs wait for a core.

:func:`to_host` waits on an event made with ``blocking=True`` (``cudaEventBlockingSync``:
the thread sleeps until the device signals) and only then copies, so the copies find the
queue empty. The cost is the wake-up, tens of microseconds, which the tuner measures with
the rest of the pass (its profile times ``act`` itself). On the CPU it is ``.cpu().numpy()``.
This module imports torch only when a tensor is on a CUDA device.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ["to_host", "wait_for_device"]

_local = threading.local()  # one blocking event per (thread, device): recorded again each pass


def wait_for_device(device: Any) -> None:
    """Block, without spinning a core, until the work queued on ``device``'s current stream
    is done (nothing on a non-CUDA device)."""
    if getattr(device, "type", None) != "cuda":
        return
    import torch

    events = getattr(_local, "events", None)
    if events is None:
        events = _local.events = {}
    index = device.index if device.index is not None else torch.cuda.current_device()
    event = events.get(index)
    if event is None:
        event = events[index] = torch.cuda.Event(blocking=True)
    event.record(torch.cuda.current_stream(index))
    event.synchronize()


def to_host(*tensors: Any) -> list[np.ndarray]:
    """``[t.cpu().numpy() for t in tensors]``, waiting for a CUDA device's pass by blocking
    (see the module docstring) before the copies.

    >>> import torch
    >>> to_host(torch.tensor([1, 2]), torch.tensor([0.5]))
    [array([1, 2]), array([0.5], dtype=float32)]
    """
    for t in tensors:
        if getattr(t, "is_cuda", False):
            wait_for_device(t.device)
            break
    return [t.cpu().numpy() for t in tensors]
