"""One line around an RLlib ``AlgorithmConfig`` (new API stack, PPO): :func:`wrap_rllib`.

``wrap_rllib(config)`` returns the same config object, set up so that the algorithm it builds
samples through an Auturi executor::

    from ray.rllib.algorithms.ppo import PPOConfig
    import auturi

    config = PPOConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=8)
    algo = auturi.wrap(config).build_algo()
    algo.train()          # unchanged; result["env_runners"]["auturi"] reports the layout

How it fits into RLlib:

- the config gets ``env_runner_cls=AuturiEnvRunner`` and ``num_env_runners=0``: sampling
  happens in the local EnvRunner, in the algorithm's process, which owns one executor holding
  all ``num_env_runners * num_envs_per_env_runner`` envs (the tuner starts from RLlib's own
  layout: one actor per EnvRunner);
- :class:`AuturiEnvRunner` is a ``SingleAgentEnvRunner``: it keeps RLlib's module, connectors,
  metrics, callbacks and state handling, and replaces only the timestep-sampling loop. Each
  ``sample()`` runs ``executor.collect(T)`` (``T`` = the rollout fragment per env) and turns the
  time-major rollout into ``SingleAgentEpisode`` chunks, continuing ongoing episodes across
  calls (same id, ``cut()`` with the configured lookback) exactly as RLlib's runner does;
- the policy replicas run :class:`RLModulePolicy`: the RLModule's ``forward_exploration`` and
  the module's own action distribution, but the action is drawn from the executor's per-env,
  per-step uniforms (inverse CDF for Categorical, ``loc + scale * ndtri(u)`` for DiagGaussian),
  so the data never depend on the layout. Weights reach the replicas once per training
  iteration (after RLlib's weight sync), through ``executor.set_policy_state``;
- the envs are rebuilt in the workers from ``config.env`` (a gymnasium id, a ``register_env``
  name or an env creator) and ``env_config`` by :class:`RLlibEnvFactory`.

Importing this module imports neither ray nor torch: env workers unpickle its env factories.
The EnvRunner class itself (a ``SingleAgentEnvRunner`` subclass) is created on first access of
``auturi.adapters.rllib.AuturiEnvRunner``.
"""
from __future__ import annotations

from typing import Any

from auturi.adapters.rllib.base import UnsupportedConfigError
from auturi.adapters.rllib.envs import RLlibEnvFactory
from auturi.adapters.rllib.policy import RLModulePolicy, module_state
from auturi.adapters.rllib.runner import RLlibHandle, runner_class
from auturi.adapters.rllib.wrap import unwrap_rllib, wrap_rllib

__all__ = ["AuturiEnvRunner", "RLlibEnvFactory", "RLlibHandle", "RLModulePolicy", "UnsupportedConfigError",
           "module_state", "unwrap_rllib", "wrap_rllib"]


def __getattr__(name: str) -> Any:
    if name == "AuturiEnvRunner":
        return runner_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
