"""Where envs come from: the env sources an executor takes.

An executor takes ``env`` as a gymnasium id (``"CartPole-v1"``), an EnvPool id
(``"envpool:Pong-v5"``), one ``Callable[[], gymnasium.Env]`` used for every env, or a list of
them, one per env. :func:`resolve_env_fns` turns the first, third and fourth into one factory per
env; factories travel to worker processes with cloudpickle, so lambdas work.

Ids that a module registers when imported work in the caller and in every worker: gymnasium's
``"module:Env-v0"`` spelling (the module is imported here and again in each worker before
``gym.make``), ids of known providers (``"ALE/Pong-v5"`` imports ``ale_py``, see
:data:`ID_PROVIDERS`), and any id registered in the caller (the factory carries the id's
``EnvSpec``, so a worker that lacks the registration makes the env from it).

The package's modules, by role: :mod:`auturi.envs.base` (the EnvPool id prefix and
:func:`env_seed`, which every source shares), :mod:`auturi.envs.envpool` (EnvPool's source and
runner) and :mod:`auturi.envs.testing` (the test envs, re-exported here as before:
``from auturi.envs import CountingEnv``).

This package must not import torch: env workers import it.
"""
from __future__ import annotations

import importlib
import importlib.util
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
    "EnvFn", "EnvLike", "ENVPOOL_PREFIX", "EnvPoolSource", "ID_PROVIDERS", "env_seed", "find_env_id", "is_envpool",
    "resolve_env_fns",
    "ACTION_SPACES", "ActionDtypeEnv", "CountingEnv", "FaultyEnv", "HeavyTailEnv", "LargeObsEnv", "SlowEnv",
]

EnvFn = Callable[[], gym.Env]
EnvLike = Union[str, EnvFn, Sequence[EnvFn]]

ID_PROVIDERS: dict[str, str] = {"ALE": "ale_py"}
"""Id namespace -> the module whose import registers its ids (gymnasium 1.x no longer loads
plugins by itself)."""
PROVIDER_MODULES = ("ale_py", "gymnasium_robotics")
"""Modules tried, when installed, for an unknown id without a known namespace (gymnasium-
robotics registers ``FetchReach-v4``, ``AntMaze_UMaze-v5``, ... on import)."""


class _MakeById:
    """A picklable ``gym.make(env_id, **kwargs)`` that works where the id is not registered:
    it imports ``module`` first (the module that registers the id), and makes the env from
    the caller's ``EnvSpec`` if the id is still unknown in this process."""

    def __init__(self, env_id: str, kwargs: dict[str, Any], module: str | None = None):
        self.env_id, self.kwargs, self.module = env_id, kwargs, module
        self.spec = gym.spec(env_id) if env_id in gym.registry else None

    def __call__(self) -> gym.Env:
        if self.module is not None:
            importlib.import_module(self.module)
        if self.env_id not in gym.registry and self.spec is not None:
            return gym.make(self.spec, **self.kwargs)
        return gym.make(self.env_id, **self.kwargs)

    def __repr__(self) -> str:
        return f"gym.make({self.env_id!r})"


def _import_registering(module: str, env: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"env {env!r}: cannot import module {module!r} ({e}); install it or check that it is on "
                         f"PYTHONPATH") from e


def find_env_id(env: str) -> tuple[str, str | None]:
    """``(id, module)`` for a gymnasium id string: ``module`` is the module whose import
    registers the id (None for ids gymnasium itself registers). ``"pkg:Env-v0"`` imports
    ``pkg``; an unknown id imports its namespace's provider (``ALE/...``: ``ale_py``) or the
    installed :data:`PROVIDER_MODULES`. Raises ``ValueError`` naming the fix.

    >>> find_env_id("CartPole-v1")
    ('CartPole-v1', None)
    >>> find_env_id("auturi.envs.testing:auturi/Counting-v0")
    ('auturi/Counting-v0', 'auturi.envs.testing')
    """
    module, sep, env_id = env.rpartition(":")
    if sep:
        if not module or not env_id:
            raise ValueError(f"env {env!r}: write module:Env-v0 (gymnasium's spelling) or an id")
        _import_registering(module, env)
    if env_id not in gym.registry:
        namespace = env_id.split("/")[0] if "/" in env_id else None
        candidates = [ID_PROVIDERS[namespace]] if namespace in ID_PROVIDERS else \
            [m for m in PROVIDER_MODULES if namespace is None and importlib.util.find_spec(m) is not None]
        for candidate in candidates:
            if importlib.util.find_spec(candidate) is None:
                extra = " (pip install 'auturi[atari]')" if candidate == "ale_py" else ""
                raise ValueError(f"env {env_id!r} needs {candidate}, which is not installed: pip install "
                                 f"{candidate.replace('_', '-')}{extra}")
            _import_registering(candidate, env)
            if env_id in gym.registry:
                module = candidate
                break
    if env_id not in gym.registry:
        close = [k for k in gym.registry if k.lower().startswith(env_id.split("-")[0].lower())][:5]
        hint = f" Similar ids: {close}." if close else ""
        raise ValueError(f"unknown gymnasium env id {env_id!r}.{hint} Register it, import the module "
                         f"that registers it (or write module:{env_id}), or pass a factory: env=lambda: MyEnv().")
    return env_id, module or None


def is_envpool(env: EnvLike) -> bool:
    return isinstance(env, str) and env.startswith(ENVPOOL_PREFIX)


def resolve_env_fns(env: EnvLike, num_envs: int | None, **make_kwargs: Any) -> list[EnvFn]:
    """One factory per env. ``num_envs`` may be None only when ``env`` is a list."""
    if isinstance(env, str):
        if is_envpool(env):
            return [EnvPoolSource(env[len(ENVPOOL_PREFIX):], **make_kwargs)] * _need(num_envs)
        env_id, module = find_env_id(env)
        fns: list[EnvFn] = [_MakeById(env_id, make_kwargs, module)] * _need(num_envs)
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
