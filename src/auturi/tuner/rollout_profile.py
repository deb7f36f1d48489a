"""The model strategy's profile from the training's own first rollouts.

Online, the first collects run under the start layout, usually the serial one (envs and
policy in the caller). Their :class:`~auturi.rollout.CollectStats` already hold what
:func:`~auturi.tuner.profile.profile_executor` would spend ~0.3 s measuring: with one actor,
one env lane and one replica, ``env_seconds / steps`` is the mean step time of one env and
``policy_seconds / forward passes`` the inference latency at the layout's batch size, and
their length is the collect length the per-collect costs are weighed against. What
they lack is added cheaply, in this process: the policy's latency at the space's other batch
sizes (a few calls each: milliseconds for an MLP) and the step time's spread and CPU share
(a few dozen steps of one env); the fitted costs (IPC, contention) start at their defaults
and the measurements correct them, as offline.

Example:
    >>> from auturi import Config
    >>> from auturi.rollout import CollectStats
    >>> st = CollectStats(steps=64, seconds=0.02, env_seconds=0.0128, policy_seconds=0.004)
    >>> p = profile_from_stats([st], Config.serial(16), num_steps=4)
    >>> round(p.env_step_seconds * 1e6), round(p.policy_latency("cpu", 16) * 1e6)
    (200, 1000)
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from auturi.config import Config
from auturi.resources import usable_cores
from auturi.tuner.profile import Profile, collect_fields
from auturi.tuner.timing import time_env, time_policy


def profiles_in_process(config: Config) -> bool:
    """Whether a collect under ``config`` times its parts as the model needs them: one actor
    stepping all its envs itself (one lane) and running the policy itself (one replica)."""
    return config.num_actors == 1 and config.env_parallel_degree == 1 and config.policies_per_actor == 1


def profile_from_stats(stats: Sequence[Any], config: Config, num_steps: int, *, backend: str = "shm",
                       cores: int | None = None) -> Profile:
    """A :class:`Profile` from the stats of collects under the in-process ``config``
    (:func:`profiles_in_process`): the median per-collect step time and inference latency at
    ``config.policy_batch_size`` (spread, CPU share and other batch sizes left at their
    defaults; :func:`profile_from_rollouts` adds them).

    Raises:
        ValueError: ``config`` does not profile in process, or no stats have steps.
    """
    if not profiles_in_process(config):
        raise ValueError(f"{config} runs envs or inference in other processes: its collect stats do not time "
                         f"one env step and one forward pass; profile under the serial layout")
    good = [s for s in stats if s is not None and s.steps > 0]
    if not good:
        raise ValueError("no collect stats with steps to profile from")
    passes = num_steps * math.ceil(config.envs_per_actor / config.policy_batch_size)
    env = statistics.median(s.env_seconds / s.steps for s in good)
    pol = statistics.median(s.policy_seconds / passes for s in good)
    dev = config.policy_device
    return Profile(env_step_seconds=env, policy_seconds={dev: {config.policy_batch_size: pol}},
                   cores=int(cores or usable_cores()), backend=backend, num_steps=int(num_steps))


def profile_from_rollouts(executor: Any, stats: Sequence[Any], config: Config, num_steps: int, *,
                          batch_sizes: Sequence[int] = (), devices: Sequence[str] = ("cpu",),
                          cores: int | None = None, env_seconds: float = 0.02,
                          policy_seconds: float = 0.005) -> Profile:
    """:func:`profile_from_stats`, plus what is cheap to add when ``executor`` has
    ``env_fns`` and ``policy`` (an executor without them, e.g. a test double, gets the
    stats alone): the step time's spread and CPU share from about ``env_seconds`` of one env,
    and the policy's latency at ``batch_sizes`` on ``devices`` (about ``policy_seconds``
    each; the batch size the stats timed keeps the stats' figure, taken under the real load)."""
    t0 = time.perf_counter()
    prof = profile_from_stats(stats, config, num_steps, backend=str(getattr(executor, "backend", "shm")),
                              cores=cores).replace(**collect_fields(executor, num_steps))
    env_fns = getattr(executor, "env_fns", None)
    policy = getattr(executor, "policy", None)
    if env_fns and policy is not None and hasattr(policy, "act"):
        _, std, cpu_frac, obs, tail = time_env(env_fns[0], seed=int(getattr(executor, "seed", 0)),
                                               seconds=env_seconds, max_steps=500)
        wall: dict[str, dict[int, float]] = {}
        cpu: dict[str, dict[int, float]] = {}
        for dev in devices:
            wall[dev], cpu[dev] = time_policy(policy, obs, sorted(set(batch_sizes) or {config.policy_batch_size}),
                                              dev, seconds=policy_seconds, max_calls=10)
        # The batch the rollouts ran keeps its in-training figure; the others are scaled to
        # match it, so a loaded machine shifts them all alike.
        b, dev = config.policy_batch_size, config.policy_device
        measured = prof.policy_seconds[dev][b]
        if b in wall.get(dev, {}) and wall[dev][b] > 0:
            scale = measured / wall[dev][b]
            wall = {d: {k: v * scale for k, v in t.items()} for d, t in wall.items()}
        wall.setdefault(dev, {})[b] = measured
        prof = prof.replace(env_step_std=std, env_step_quantiles=tail, env_cpu_fraction=cpu_frac,
                            obs_bytes=int(np.asarray(obs).nbytes),
                            policy_seconds=wall, policy_cpu_seconds=cpu)
    return prof.replace(profile_seconds=time.perf_counter() - t0)


WRAP_CALIBRATION_CALLS = 2
"""Rounds of the torch thread count's calibration (``best_threads``) per timed batch size in
the wrap-time look (the executor's own: ``policy_runner.CALIBRATION_CALLS``, 5). On 2 cores a
wrap of SB3's CnnPolicy spent 2.9 of its 4.2 s of policy timing there (2026-11-27)."""


def sparse_sizes(sizes: Sequence[int], keep: int) -> list[int]:
    """The smallest and largest of ``sizes``, ``keep``, and the sizes between at least 4x
    apart (counted down from the largest).

    >>> sparse_sizes([1, 2, 4, 8, 16, 32, 64], keep=64)
    [1, 4, 16, 64]
    >>> sparse_sizes([1, 3, 6, 12], keep=6)
    [1, 3, 6, 12]
    """
    if not sizes:
        return [keep]
    ordered = sorted(set(sizes))
    out, last = {ordered[0], ordered[-1], keep}, ordered[-1]
    for b in reversed(ordered[:-1]):
        if b * 4 <= last:
            out.add(b)
            last = b
    return sorted(out)


def profile_at_wrap(executor: Any, config: Config, num_steps: int, *, batch_sizes: Sequence[int] = (),
                    devices: Sequence[str] = ("cpu",), cores: int | None = None, env_seconds: float = 0.2,
                    policy_seconds: float = 0.005) -> Profile | None:
    """A :class:`Profile` before any collect (the online tuner's wrap-time look on a many-core
    machine): one env built from ``executor.env_fns[0]`` in this process, stepped for about
    ``env_seconds`` and closed (the executor's own envs are never touched: the training's data
    stays the serial loop's), and the policy timed on a copy at ``batch_sizes`` on ``devices``
    (:func:`~auturi.tuner.timing.time_policy`). None when ``executor`` has no ``env_fns`` or
    no policy to time. Unlike :func:`profile_from_rollouts`, nothing here ran under the
    training's load: the figures are one env's and one forward pass's alone."""
    env_fns = getattr(executor, "env_fns", None)
    policy = getattr(executor, "policy", None)
    if not env_fns or policy is None or not hasattr(policy, "act"):
        return None
    t0 = time.perf_counter()
    step, std, cpu_frac, obs, tail = time_env(env_fns[0], seed=int(getattr(executor, "seed", 0)),
                                              seconds=env_seconds, max_steps=500)
    sizes = sorted(set(batch_sizes) | {config.policy_batch_size})
    wall: dict[str, dict[int, float]] = {}
    cpu: dict[str, dict[int, float]] = {}
    for dev in dict.fromkeys([config.policy_device, *devices]):
        # The look runs while the user's training waits: a forward pass of a CNN on the CPU
        # is tens of milliseconds, so the CPU is timed at every fourth size (the profile
        # interpolates between them) where the start acts on another device, and each size's
        # thread count is chosen in WRAP_CALIBRATION_CALLS rounds.
        at = sizes if dev == config.policy_device or not dev.startswith("cpu") else \
            sparse_sizes(sizes, keep=config.policy_batch_size)
        wall[dev], cpu[dev] = time_policy(policy, obs, at, dev, seconds=policy_seconds, max_calls=10,
                                          calibration_calls=WRAP_CALIBRATION_CALLS)
    prof = Profile(env_step_seconds=step, env_step_std=std, env_step_quantiles=tail, env_cpu_fraction=cpu_frac,
                   obs_bytes=int(np.asarray(obs).nbytes), policy_seconds=wall, policy_cpu_seconds=cpu,
                   cores=int(cores or usable_cores()), backend=str(getattr(executor, "backend", "shm")),
                   num_steps=int(num_steps))
    return prof.replace(**collect_fields(executor, num_steps), profile_seconds=time.perf_counter() - t0)
