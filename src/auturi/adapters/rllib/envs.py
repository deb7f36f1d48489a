"""Env side of the RLlib face: the picklable recipe of one sub-env, as RLlib's
``SingleAgentEnvRunner.make_env`` builds it. Runs in env workers: imports neither ray nor
torch (a creator imports whatever its own module does)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from auturi.adapters.rllib.base import UnsupportedConfigError

__all__ = ["RLlibEnvFactory", "env_factory"]


class _EnvContext(dict):
    """What RLlib's ``EnvContext`` gives an env creator (the ``env_config`` dict plus
    ``worker_index``, ``num_workers``, ``vector_index``, ``remote``, ``recreated_worker``),
    without importing ray.rllib (which imports torch) in env workers."""

    def __init__(self, env_config: Mapping[str, Any], worker_index: int = 0, num_workers: int = 0,
                 vector_index: int = 0, remote: bool = False, recreated_worker: bool = False):
        super().__init__(env_config)
        self.worker_index, self.num_workers, self.vector_index = worker_index, num_workers, vector_index
        self.remote, self.recreated_worker = remote, recreated_worker

    def copy_with_overrides(self, env_config: Mapping[str, Any] | None = None, worker_index: int | None = None,
                            vector_index: int | None = None, remote: bool | None = None,
                            num_workers: int | None = None, recreated_worker: bool | None = None) -> _EnvContext:
        return _EnvContext(
            dict(self) if env_config is None else env_config,
            self.worker_index if worker_index is None else worker_index,
            self.num_workers if num_workers is None else num_workers,
            self.vector_index if vector_index is None else vector_index,
            self.remote if remote is None else remote,
            self.recreated_worker if recreated_worker is None else recreated_worker)

    def set_defaults(self, defaults: Mapping[str, Any]) -> None:
        for k, v in defaults.items():
            self.setdefault(k, v)


class RLlibEnvFactory:
    """A picklable recipe for one env as RLlib's ``SingleAgentEnvRunner.make_env`` builds each
    sub-env: ``gym.make(env_spec, **env_config)`` for a gymnasium id (its registered spec), or ``creator(env_context)``
    for a ``register_env`` name or a callable ``config.env`` (kept cloudpickled, so an env
    worker imports only what the creator itself needs)."""

    def __init__(self, kind: str, payload: Any, env_config: Mapping[str, Any], name: str):
        if kind not in ("make", "creator"):
            raise ValueError(f"unknown env recipe kind {kind!r}")
        self.kind, self.payload, self.env_config, self.name = kind, payload, dict(env_config), name
        self._creator = None

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_creator"] = None
        return d

    def __call__(self) -> gym.Env:
        if self.kind == "make":
            return gym.make(self.payload, **self.env_config)
        if self._creator is None:
            import cloudpickle

            self._creator = cloudpickle.loads(self.payload)
        env = self._creator(_EnvContext(self.env_config))
        if not isinstance(env, gym.Env):
            raise UnsupportedConfigError(
                f"the env creator for {self.name!r} returned a {type(env).__name__}, not a gymnasium.Env; auturi.wrap "
                f"supports single-agent gymnasium envs only (not MultiAgentEnv or vector envs)")
        return env

    def __repr__(self) -> str:
        return f"RLlibEnvFactory({self.kind}, {self.name})"



def env_factory(runner: Any) -> RLlibEnvFactory:
    """The recipe of one sub-env, as ``SingleAgentEnvRunner.make_env`` builds it."""
    import cloudpickle
    from ray.tune.registry import ENV_CREATOR, _global_registry

    cfg = runner.config
    env, env_config = cfg.env, dict(cfg.env_config or {})
    if isinstance(env, str) and _global_registry.contains(ENV_CREATOR, env):
        creator, name = _global_registry.get(ENV_CREATOR, env), env
    elif callable(env):
        creator, name = env, getattr(env, "__name__", type(env).__name__)
    else:
        # The registered spec, not the id: workers fork from a server that never saw a
        # gym.register() made at runtime in this process.
        spec = gym.spec(env) if env in gym.registry else env
        return RLlibEnvFactory("make", spec, env_config, name=str(env))
    try:
        blob = cloudpickle.dumps(creator)
    except Exception as exc:
        raise UnsupportedConfigError(
            f"the env creator for {name!r} cannot be pickled to the executor's workers ({type(exc).__name__}: "
            f"{exc}); register a module-level function with ray.tune.registry.register_env instead") from exc
    return RLlibEnvFactory("creator", blob, env_config, name=name)

