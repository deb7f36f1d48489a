"""This machine's resources, as Auturi counts them: the cores this process may run on and
the CUDA devices torch sees.

One definition for every module that needs them (the ``shm`` backend's pins and policy
threads, the Ray backend's local instance size, the tuner's space, profile and cache key):
"usable" means this process's affinity mask, not the machine's core count, so a job started
under ``taskset`` or a container CPU set plans for the cores it really has.

Example:
    >>> from auturi.resources import usable_cores, usable_cores_set
    >>> usable_cores() == len(usable_cores_set()) >= 1
    True
"""
from __future__ import annotations

import os


def usable_cores_set() -> set[int]:
    """Ids of the cores this process may run on (its affinity mask; every core off Linux)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores this process may run on (see :func:`usable_cores_set`)."""
    return len(usable_cores_set())


def cuda_device_count() -> int:
    """CUDA devices torch sees; 0 without torch or without a usable GPU.

    torch is imported here, only when asked: building a plan or a space for a CPU-only
    workload must not import it, and env workers never call this."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
