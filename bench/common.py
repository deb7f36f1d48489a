"""Shared bits of the benchmarks: the machine header and robust summaries."""
from __future__ import annotations

import os
import platform
import statistics
import sys
from typing import Sequence


def machine_header() -> str:
    import gymnasium
    import numpy

    cpu = platform.processor() or "unknown cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    vers = [f"python {platform.python_version()}", f"numpy {numpy.__version__}", f"gymnasium {gymnasium.__version__}"]
    for mod in ("torch", "stable_baselines3", "envpool"):
        m = sys.modules.get(mod)
        if m is not None:
            vers.append(f"{mod} {m.__version__}")
    return f"{cpu}, {cores} cores, {mem}; " + ", ".join(vers)


def median_spread(xs: Sequence[float]) -> tuple[float, float]:
    """Median and half the interquartile range, as a fraction of the median."""
    xs = sorted(xs)
    med = statistics.median(xs)
    if len(xs) < 4:
        return med, (xs[-1] - xs[0]) / 2 / med if med else 0.0
    q = statistics.quantiles(xs, n=4)
    return med, (q[2] - q[0]) / 2 / med if med else 0.0
