"""Timing a workload's parts in this process, without starting workers: one env's steps
(:func:`time_env`: the mean and spread of a step, its quantiles, how much of it is CPU rather
than waiting, one observation) and the policy's forward passes per batch size on a device
(:func:`time_policy`).

:func:`~auturi.tuner.profile.profile_executor` (offline) and
:mod:`~auturi.tuner.rollout_profile` (from the training's first rollouts) turn these figures
into a :class:`~auturi.tuner.profile.Profile`. This module returns plain numbers and does not
import :mod:`~auturi.tuner.profile`, which re-exports its names (``from auturi.tuner.profile
import time_env`` keeps working; the import checker, ``tests/test_imports.py``, counts every
import, so importing it back would close a circle).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

STEP_QUANTILES = 64
"""Probability levels a profile keeps of one step's time
(:attr:`~auturi.tuner.profile.Profile.env_step_quantiles`)."""
MIN_TAIL_STEPS = 100
"""Steps profiled from which their quantiles stand for the tail: fewer (a rollout's profile
steps one env ~20 ms) and the normal spread is used."""


def step_quantiles(times: Sequence[float]) -> tuple[float, ...]:
    """``times`` at ``STEP_QUANTILES`` evenly spaced levels (midpoints), or () when fewer than
    ``MIN_TAIL_STEPS``.

    >>> len(step_quantiles([1e-3] * 200)), step_quantiles([1e-3] * 10)
    (64, ())
    """
    if len(times) < MIN_TAIL_STEPS:
        return ()
    levels = (np.arange(STEP_QUANTILES) + 0.5) / STEP_QUANTILES
    return tuple(float(x) for x in np.quantile(np.asarray(times, dtype=np.float64), levels))


class EnvTiming(NamedTuple):
    """What :func:`time_env` measured of one env."""

    mean: float
    """Mean step seconds (a reset after an episode ends counts in that step)."""
    std: float
    cpu_fraction: float
    obs: np.ndarray
    """One observation."""
    quantiles: tuple[float, ...]
    """:func:`step_quantiles` of the step times."""


def time_env(env_fn: Any, seed: int = 0, seconds: float = 0.3, min_steps: int = 20,
             max_steps: int = 5000) -> EnvTiming:
    """Step one env with seeded random actions for about ``seconds`` (``min_steps`` to
    ``max_steps`` steps): :class:`EnvTiming`. A reset after an episode ends counts in that step.
    The env comes from ``env_fn.for_timing()`` where the factory has one: random-action episodes
    must not reach the user's files (SB3's ``monitor_dir``)."""
    quiet = getattr(env_fn, "for_timing", None)
    env = (quiet() if callable(quiet) else env_fn)()
    try:
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        times: list[float] = []
        w0, c0 = time.perf_counter(), time.process_time()
        while len(times) < max_steps and (len(times) < min_steps or time.perf_counter() - w0 < seconds):
            a = env.action_space.sample()
            t = time.perf_counter()
            _, _, term, trunc, _ = env.step(a)
            if term or trunc:
                env.reset()
            times.append(time.perf_counter() - t)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    finally:
        env.close()
    frac = min(1.0, cpu / wall) if wall > 0 else 1.0
    return EnvTiming(statistics.fmean(times), statistics.pstdev(times), frac, np.asarray(obs), step_quantiles(times))


def time_policy(policy: Any, obs: np.ndarray, batch_sizes: Sequence[int], device: str = "cpu",
                seconds: float = 0.05, min_calls: int = 3, max_calls: int = 50,
                calibration_calls: int | None = None) -> tuple[dict[int, float], dict[int, float]]:
    """Median wall and mean CPU seconds of ``policy.act`` per batch size, on a copy of the
    policy moved to ``device`` (the executor's own policy object is left where it is), each
    at the torch thread count the executor's calibration would choose for it
    (``calibration_calls`` rounds of it; default the executor's)."""
    import cloudpickle

    from auturi.executor.policy_runner import CALIBRATION_CALLS, best_threads, torch_threads, uses_torch

    replica = cloudpickle.loads(cloudpickle.dumps(policy))
    state = policy.get_state()
    if state:
        replica.load_state(state)
    replica.to(device)
    k = int(getattr(policy, "noise_dim", 0))
    rng = np.random.default_rng(0)
    wall: dict[int, float] = {}
    cpu: dict[int, float] = {}
    for b in batch_sizes:
        batch = np.repeat(np.asarray(obs)[None], b, axis=0)
        noise = rng.random((b, k), dtype=np.float32)
        for _ in range(2):  # first calls build the model, allocate, pick kernels
            replica.act(batch, noise)
        # Timed at the torch thread count the executor's PolicyRunner would choose for it.
        threads = best_threads(lambda: replica.act(batch, noise), calls=calibration_calls or CALIBRATION_CALLS) \
            if uses_torch(replica) else None
        ts: list[float] = []
        with torch_threads(threads):
            c0, w0 = time.process_time(), time.perf_counter()
            while len(ts) < max_calls and (len(ts) < min_calls or time.perf_counter() - w0 < seconds):
                t = time.perf_counter()
                replica.act(batch, noise)
                ts.append(time.perf_counter() - t)
        wall[b] = statistics.median(ts)
        cpu[b] = (time.process_time() - c0) / len(ts)
    return wall, cpu
