"""Executors: one contract (:class:`Executor`; its tuner half written down as
:class:`~auturi.executor.contract.ExecutorLike`), backends ``serial``, ``shm`` (and ``ray``),
made by :func:`make_executor`; :func:`warm_backend` starts a backend's servers before there
is an executor."""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from auturi.config import Config
from auturi.envs import EnvLike
from auturi.executor.base import Executor
from auturi.executor.contract import ExecutorLike, MoveCost
from auturi.policy import Policy

BACKENDS = ("serial", "shm", "ray")


def make_executor(env: EnvLike, policy: Policy, num_envs: int | None = None, config: Config | None = None,
                  *, backend: str = "shm", seed: int = 0, **kwargs: Any) -> Executor:
    """Build an executor: ``collect(num_steps)`` returns a :class:`~auturi.Rollout`,
    ``reconfigure(config)`` changes the layout; close it (or use ``with``).

    Args:
        env: a gymnasium id (``"CartPole-v1"``, ``"ALE/Pong-v5"``, ``"pkg:Env-v0"``), an
            EnvPool id (``"envpool:Pong-v5"``), a factory returning a ``gymnasium.Env`` (used
            for every env; lambdas work) or a list of factories, one per env.
        policy: a :class:`~auturi.Policy` (``RandomPolicy``, ``TorchPolicy``, your own).
        num_envs: total envs; may be left out when ``env`` is a list (one factory per env) or
            ``config`` is given (its ``num_envs``).
        config: the layout (:class:`~auturi.Config`); default: the serial one.
        backend: ``"shm"`` (processes and shared memory, the default), ``"serial"``
            (everything in this process) or ``"ray"`` (one Ray actor per actor, on a Ray
            cluster; ``address=`` picks the cluster, see :mod:`auturi.executor.ray`;
            needs ``pip install "auturi[ray]"``).
        seed: env ``i`` is seeded ``seed + i``; action noise is drawn from it too.

    ``worker_timeout=SECONDS`` (every backend; default ``None``: ``AUTURI_WORKER_TIMEOUT`` or
    60 s; ``math.inf``: never) bounds how long a worker process may make no progress: past it
    the collect raises :class:`auturi.WorkerError` naming the stuck worker, its envs and the
    config, with its Python stack, and the executor closes (see :class:`Executor`); it bounds
    one env's silence, in the caller's process too.

    ``check_finite=True`` (every backend; default False, as gymnasium's checker): NaN or inf
    in an observation or reward is an :class:`auturi.EnvCheckError` naming the env and step.

    >>> import gymnasium as gym, auturi
    >>> from auturi.envs import CountingEnv
    >>> with auturi.make_executor(CountingEnv, auturi.RandomPolicy(gym.spaces.Discrete(3)), 4,
    ...                           backend="serial", seed=1) as ex:
    ...     rollout = ex.collect(8)
    >>> rollout.observations.shape[:2]
    (8, 4)
    """
    if backend == "serial":
        from auturi.executor.serial import SerialExecutor

        return SerialExecutor(env, policy, num_envs, config, seed=seed, **kwargs)
    if backend == "shm":
        from auturi.executor.shm import ShmExecutor

        return ShmExecutor(env, policy, num_envs, config, seed=seed, **kwargs)
    if backend == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise ImportError('backend="ray" needs Ray, which is not installed: pip install "auturi[ray]" '
                              '(or use backend="shm" on one machine)')
        from auturi.executor.ray import RayExecutor  # imports ray only when used

        return RayExecutor(env, policy, num_envs, config, seed=seed, **kwargs)
    raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")


EXECUTOR_KEYWORDS: dict[str, frozenset[str]] = {
    "all": frozenset({"env_id_offset", "worker_timeout", "check_finite"}),
    "shm": frozenset({"start_method", "defer_envs"}),
    "ray": frozenset({"address", "start_timeout", "actor_resources"}),
}
"""The keywords :func:`make_executor` passes on, every backend's (``"all"``) and one
backend's own: ``auturi.tune`` names an unknown one before any worker starts. A table, not
the constructors' signatures read at run time: reading the Ray backend's imports Ray
(``tests/test_tune_api_inputs.py`` checks it against the signatures)."""


def warm_backend(backend: str, *, policy_processes: bool = True) -> Callable[[], None]:
    """Start now, in the background, what ``backend``'s worker processes fork from, before
    any executor exists (``auturi tune`` does, so the imports run while it probes the env and
    builds the policy); returns a function that blocks until that serves, to call before a
    measurement (whose collects must not share the cores with those imports).

    ``shm`` under the ``forkserver`` start method (the default): the env workers' forkserver
    and, with ``policy_processes``, the torch one. Other backends and start methods: nothing
    (the returned function returns at once).

    >>> warm_backend("serial")()  # nothing to start
    """
    if backend != "shm" or os.environ.get("AUTURI_START_METHOD", "forkserver") != "forkserver":
        return _nothing
    from auturi.executor.shm.forkservers import start_servers, wait_ready

    start_servers(torch=policy_processes)

    def wait() -> None:
        wait_ready(torch=policy_processes)

    return wait


def _nothing() -> None:
    """What :func:`warm_backend` returns when it started nothing."""


__all__ = ["Executor", "ExecutorLike", "MoveCost", "make_executor", "warm_backend", "BACKENDS", "EXECUTOR_KEYWORDS"]
