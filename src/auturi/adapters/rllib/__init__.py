"""One line around an RLlib ``AlgorithmConfig`` (new API stack; PPO, APPO, IMPALA, DQN, SAC):
:func:`wrap_rllib`.

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
- the policy replicas run :class:`RLModulePolicy`: the RLModule's own exploration (its action
  distribution for PPO, APPO, IMPALA and SAC; epsilon-greedy for DQN, with the runner's
  current epsilon), but every random draw comes from the executor's per-env, per-step
  uniforms, so the data never depend on the layout. Weights (and DQN's epsilon) reach the
  replicas through ``executor.set_policy_state`` before the next collect after they change;
- the envs are rebuilt in the workers from ``config.env`` (a gymnasium id, a ``register_env``
  name or an env creator) and ``env_config`` by :class:`RLlibEnvFactory`.

The parts: :mod:`~auturi.adapters.rllib.base` (the error type, the options attribute),
:mod:`~auturi.adapters.rllib.envs` (env recipes, run in env workers),
:mod:`~auturi.adapters.rllib.policy` (the replicas' policy), :mod:`~auturi.adapters.rllib.runner`
(the EnvRunner and its handle), :mod:`~auturi.adapters.rllib.wrap` (what is supported, wrap and
unwrap).

Importing this package imports neither ray nor torch: env workers unpickle its env factories.
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
