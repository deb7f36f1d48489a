"""Executors: one contract (:class:`Executor`), backends ``serial``, ``shm`` (and ``ray``)."""
from __future__ import annotations

from typing import Any

from auturi.config import Config
from auturi.envs import EnvLike
from auturi.executor.base import Executor
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
        num_envs: total envs; may be left out when ``env`` is a list or ``config`` is given.
        config: the layout (:class:`~auturi.Config`); default: the serial one.
        backend: ``"shm"`` (processes and shared memory, the default), ``"serial"``
            (everything in this process) or ``"ray"`` (one Ray actor per actor, on a Ray
            cluster; ``address=`` picks the cluster, see :mod:`auturi.executor.ray_backend`;
            needs ``pip install "auturi[ray]"``).
        seed: env ``i`` is seeded ``seed + i``; action noise is drawn from it too.

    ``worker_timeout=SECONDS`` (every backend; default ``None``: ``AUTURI_WORKER_TIMEOUT`` or
    60 s; ``math.inf``: never) bounds how long a worker process may make no progress: past it
    the collect raises :class:`auturi.WorkerError` naming the stuck worker, its envs and the
    config, with its Python stack, and the executor closes (see :class:`Executor`).

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
        from auturi.executor.ray_backend import RayExecutor  # imports ray only when used

        return RayExecutor(env, policy, num_envs, config, seed=seed, **kwargs)
    raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")


__all__ = ["Executor", "make_executor", "BACKENDS"]
