"""Where envs come from: the env sources an executor takes.

An executor takes ``env`` as a gymnasium id (``"CartPole-v1"``), an EnvPool id
(``"envpool:Pong-v5"``), one ``Callable[[], gymnasium.Env]`` used for every env, or a list of
them, one per env. :func:`resolve_env_fns` turns the first, third and fourth into one factory per
env; factories travel to worker processes with cloudpickle, so lambdas work.

The package's modules, by role: :mod:`auturi.envs.base` (the EnvPool id prefix and
:func:`env_seed`, which every source shares), :mod:`auturi.envs.envpool` (EnvPool's source and
runner) and :mod:`auturi.envs.testing` (the test envs, re-exported here as before:
``from auturi.envs import CountingEnv``).

This package must not import torch: env workers import it.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence, Union

import gymnasium as gym

from auturi.envs.base import ENVPOOL_PREFIX, env_seed
from auturi.envs.envpool import EnvPoolSource
from auturi.envs.testing import (
    ACTION_SPACES,
    ActionDtypeEnv,
    CountingEnv,
    FaultyEnv,
    HeavyTailEnv,
    LargeObsEnv,
    SlowEnv,
)

__all__ = [
    "EnvFn", "EnvLike", "ENVPOOL_PREFIX", "EnvPoolSource", "env_seed", "is_envpool", "resolve_env_fns",
    "ACTION_SPACES", "ActionDtypeEnv", "CountingEnv", "FaultyEnv", "HeavyTailEnv", "LargeObsEnv", "SlowEnv",
]

EnvFn = Callable[[], gym.Env]
EnvLike = Union[str, EnvFn, Sequence[EnvFn]]

class _MakeById:
    """A picklable ``gym.make(env_id, **kwargs)``."""

    def __init__(self, env_id: str, kwargs: dict[str, Any]):
        self.env_id, self.kwargs = env_id, kwargs

    def __call__(self) -> gym.Env:
        return gym.make(self.env_id, **self.kwargs)

    def __repr__(self) -> str:
        return f"gym.make({self.env_id!r})"


def is_envpool(env: EnvLike) -> bool:
    return isinstance(env, str) and env.startswith(ENVPOOL_PREFIX)


def resolve_env_fns(env: EnvLike, num_envs: int | None, **make_kwargs: Any) -> list[EnvFn]:
    """One factory per env. ``num_envs`` may be None only when ``env`` is a list."""
    if isinstance(env, str):
        if is_envpool(env):
            return [EnvPoolSource(env[len(ENVPOOL_PREFIX):], **make_kwargs)] * _need(num_envs)
        if env not in gym.registry:
            close = [k for k in gym.registry if k.lower().startswith(env.split("-")[0].lower())][:5]
            hint = f" Similar ids: {close}." if close else ""
            raise ValueError(f"unknown gymnasium env id {env!r}.{hint} Register it, import the module "
                             f"that registers it, or pass a factory: env=lambda: MyEnv().")
        fns: list[EnvFn] = [_MakeById(env, make_kwargs)] * _need(num_envs)
    elif callable(env):
        fns = [env] * _need(num_envs)
    elif isinstance(env, Sequence) and env and all(callable(f) for f in env):
        fns = list(env)
        if num_envs is not None and num_envs != len(fns):
            raise ValueError(f"num_envs={num_envs} but {len(fns)} env factories were given; pass one per env")
    else:
        raise TypeError(f"env must be a gymnasium id, an EnvPool id ('envpool:Pong-v5'), a factory "
                        f"returning a gymnasium.Env, or a list of them; got {env!r}")
    return fns


def _need(num_envs: int | None) -> int:
    if num_envs is None or num_envs < 1:
        raise ValueError("num_envs (>= 1) is required when env is an id or a single factory")
    return num_envs
