"""Auturi: find, by measurement, the fastest way to parallelize RL experience collection,
and run it without changing what the learner receives.

Importing ``auturi`` does not import torch (env workers import this package).

Example (find the fastest layout for a workload, then use it):
    >>> import auturi, gymnasium as gym
    >>> from auturi.envs import CountingEnv
    >>> result = auturi.tune(CountingEnv, policy=auturi.RandomPolicy(gym.spaces.Discrete(3)), num_envs=4, num_steps=8,
    ...                      budget_trials=2, backend="serial", cache=False)
    >>> result.config.num_envs
    4

With SB3: ``model = auturi.wrap(PPO("MlpPolicy", env), config=result.config)``.
"""
import auturi._forkserver_signals  # noqa: F401 - first: a forkserver importing us ignores Ctrl-C
from auturi._version import __version__
from auturi.config import Config
from auturi.errors import AuturiError, ConfigError, EnvCheckError, WorkerError
from auturi.executor import Executor, make_executor
from auturi.policy import ConstantPolicy, Policy, RandomPolicy, TorchPolicy
from auturi.rollout import CollectStats, Rollout
from auturi.tuner import OnlineTuner, SearchSpace, Tuner, TuneReport, TuneResult, build_space, tune


def wrap(obj, **kwargs):
    """One line around a training object; it then collects through Auturi.

    - a Stable-Baselines3 model (on-policy PPO, A2C; off-policy SAC, TD3, DDPG, DQN and
      sb3-contrib's TQC, QR-DQN): returns the same model, whose ``learn``
      collects through Auturi (:func:`auturi.adapters.sb3.wrap_sb3`);
    - an RLlib ``AlgorithmConfig`` (new API stack: PPO, APPO, IMPALA, DQN, SAC): returns the same config, whose
      ``build_algo()`` samples through Auturi (:func:`auturi.adapters.rllib.wrap_rllib`).

    The options (``config=``, ``budget=``, ``backend=``, ``status_port=``, ...) are those of
    the two functions above; ``docs/adapters.md`` describes them. Anything else raises
    ``TypeError`` naming what is supported:

    >>> import auturi
    >>> auturi.wrap(object())
    Traceback (most recent call last):
    ...
    TypeError: auturi.wrap supports Stable-Baselines3 models (PPO, A2C, SAC, TD3, DDPG, DQN) and RLlib AlgorithmConfigs (PPO, APPO, IMPALA, DQN, SAC); got object. For anything else build an executor with auturi.make_executor(...)

    With SB3 (needs ``stable-baselines3``; tuning runs inside ``learn``)::

        model = auturi.wrap(PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=8)))
        model.learn(100_000)          # collects through Auturi's chosen layout
        auturi.unwrap(model)          # back to SB3's own loop

    A layout found earlier: ``auturi.wrap(model, config=auturi.tune("CartPole-v1").config)``."""
    roots = {c.__module__.split(".")[0] for c in type(obj).__mro__}
    if roots & {"stable_baselines3", "sb3_contrib"}:
        from auturi.adapters.sb3 import wrap_sb3  # lazy: keeps `import auturi` torch-free

        return wrap_sb3(obj, **kwargs)
    if "ray" in roots:
        from auturi.adapters.rllib import wrap_rllib  # lazy: keeps `import auturi` ray-free

        if hasattr(obj, "train") and hasattr(obj, "env_runner_group"):
            raise TypeError("auturi.wrap takes the RLlib AlgorithmConfig, not a built Algorithm: "
                            "algo = auturi.wrap(PPOConfig()...).build_algo()")
        return wrap_rllib(obj, **kwargs)
    raise TypeError(f"auturi.wrap supports Stable-Baselines3 models (PPO, A2C, SAC, TD3, DDPG, DQN) and RLlib "
                    f"AlgorithmConfigs (PPO, APPO, IMPALA, DQN, SAC); "
                    f"got {type(obj).__name__}. For anything else build an executor with auturi.make_executor(...)")


def unwrap(obj):
    """Undo :func:`wrap`. SB3 model: close the executor and restore its own collection loop.
    RLlib AlgorithmConfig: restore its EnvRunner settings; RLlib Algorithm: end the executor's
    workers (its runner samples with RLlib's own loop from then on). Returns ``obj``.

    Example (SB3; a fixed serial layout, so nothing is tuned and no process starts):

    >>> import auturi
    >>> from stable_baselines3 import PPO
    >>> model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1)
    >>> model = auturi.wrap(model, config=auturi.Config.serial(1), backend="serial")
    >>> _ = model.learn(64)
    >>> model.auturi.collects          # both rollouts were collected by Auturi's executor
    2
    >>> auturi.unwrap(model) is model
    True
    >>> hasattr(model, "auturi")       # workers ended; learn() runs SB3's own loop again
    False
    """
    if "ray" in {c.__module__.split(".")[0] for c in type(obj).__mro__}:
        from auturi.adapters.rllib import unwrap_rllib

        return unwrap_rllib(obj)
    from auturi.adapters.sb3 import unwrap_sb3

    return unwrap_sb3(obj)

__all__ = [
    "Config", "AuturiError", "ConfigError", "EnvCheckError", "WorkerError", "Executor", "make_executor", "Policy",
    "ConstantPolicy", "RandomPolicy", "TorchPolicy", "Rollout", "CollectStats", "Tuner", "OnlineTuner",
    "TuneResult", "TuneReport", "SearchSpace", "build_space", "tune", "wrap", "unwrap", "__version__",
]
