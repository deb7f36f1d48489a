"""Shared bits of the benchmarks: the machine header and robust summaries."""
from __future__ import annotations

import os
import platform
import statistics
import sys
from typing import Any, Callable, Sequence


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
    for mod in ("torch", "stable_baselines3", "envpool", "ray", "torchrl", "tensordict", "pufferlib"):
        m = sys.modules.get(mod)
        if m is not None:
            vers.append(f"{mod} {m.__version__}")
    return f"{cpu}, {cores} cores, {mem}; " + ", ".join(vers)


def act(policy: Any, obs: Any, rng: Any) -> Any:
    """The policy's actions for a batch of observations, with fresh uniform noise from ``rng``
    (what every peer loop that calls an :class:`auturi.Policy` itself does)."""
    import numpy as np

    obs = np.asarray(obs)
    k = getattr(policy, "noise_dim", 0)
    actions, _ = policy.act(obs, rng.random((len(obs), k), dtype=np.float32))
    return actions


def save_and_print(out: dict, path: str, markdown: Callable[[dict], str]) -> dict:
    """Write a bench's record ``out`` as JSON to ``path`` (folders made), print its table, return it."""
    import json

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print()
    print(markdown(out))
    return out


def median_spread(xs: Sequence[float]) -> tuple[float, float]:
    """Median and half the interquartile range, as a fraction of the median."""
    xs = sorted(xs)
    med = statistics.median(xs)
    if len(xs) < 4:
        return med, (xs[-1] - xs[0]) / 2 / med if med else 0.0
    q = statistics.quantiles(xs, n=4)
    return med, (q[2] - q[0]) / 2 / med if med else 0.0


def summarize(xs: Sequence[float]) -> dict:
    """Every sample plus its median, half-IQR spread (fraction of the median), min and max.

    >>> s = summarize([1.0, 2.0, 3.0])
    >>> s["median"], s["min"], s["max"], s["n"]
    (2.0, 1.0, 3.0, 3)
    """
    xs = [float(x) for x in xs]
    med, spread = median_spread(xs)
    return {"median": med, "spread": spread, "min": min(xs), "max": max(xs), "n": len(xs), "samples": xs}


def interleave(runners: dict, rounds: int, run: Callable[[str, Any], float],
               progress: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """``rounds`` rounds; in each, one sample ``run(name, runner)`` of every runner in turn, so
    a drift of the machine hits every runner alike. Returns the samples by name.

    >>> interleave({"a": 1, "b": 2}, 2, lambda name, r: 10.0 * r)
    {'a': [10.0, 10.0], 'b': [20.0, 20.0]}
    """
    samples: dict[str, list[float]] = {k: [] for k in runners}
    for i in range(rounds):
        for name, r in runners.items():
            if progress is not None:
                progress(f"round {i + 1}/{rounds} {name}")
            samples[name].append(run(name, r))
    return samples


def rotated(items: Sequence[Any], k: int) -> list:
    """``items`` rotated left by ``k``: run ``k`` of alternated rounds starts with another one,
    so a position effect (the first run of a round reading slow, whatever it is) is not
    charged to one kind.

    >>> rotated(("a", "b", "c"), 1)
    ['b', 'c', 'a']
    """
    k = k % len(items) if items else 0
    return list(items[k:]) + list(items[:k])


def paired_ratios(base: dict, other: dict) -> dict[str, float] | None:
    """``base[k] / other[k]`` for every key both have (a seed, a repeat: runs measured next to
    each other): their geometric mean, lowest, highest and count ``n``; ``None`` when none pair.

    >>> paired_ratios({0: 10.0, 1: 20.0}, {0: 12.5, 1: 20.0})["max"]
    1.0
    """
    import math
    import statistics

    ratios = [base[k] / v for k, v in other.items() if k in base]
    if not ratios:
        return None
    return {"geomean": math.exp(statistics.fmean(math.log(r) for r in ratios)), "min": min(ratios),
            "max": max(ratios), "n": len(ratios)}


class ChildRates:
    """Child processes on pipes (``procs``, ``conns``, started by the subclass), each of which
    answers a request with ``(steps, t0, t1)``: :meth:`_rate` is the steps of all of them over
    the span they all ran; :meth:`close` ends them (asked, then killed after 30 s)."""

    procs: list
    conns: list

    def _rate(self, request: Any) -> float:
        for c in self.conns:
            c.send(request)
        res = [c.recv() for c in self.conns]
        return sum(r[0] for r in res) / (max(r[2] for r in res) - min(r[1] for r in res))

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
        for c in self.conns:
            c.close()
