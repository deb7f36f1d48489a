"""Auturi: find, by measurement, the fastest way to parallelize RL experience collection,
and run it without changing what the learner receives.

Importing ``auturi`` does not import torch (env workers import this package).
"""
from auturi.config import Config
from auturi.errors import AuturiError, ConfigError, WorkerError
from auturi.executor import Executor, make_executor
from auturi.policy import ConstantPolicy, Policy, RandomPolicy, TorchPolicy
from auturi.rollout import CollectStats, Rollout
from auturi.tuner import OnlineTuner, SearchSpace, Tuner, TuneResult, build_space

__version__ = "0.1.0"


def wrap(obj, **kwargs):
    """One line around a training object: today a Stable-Baselines3 on-policy model (PPO,
    A2C); returns the same object, whose ``learn`` now collects through Auturi. See
    :func:`auturi.adapters.sb3.wrap_sb3` for the options and ``docs/adapters.md``."""
    roots = {c.__module__.split(".")[0] for c in type(obj).__mro__}
    if roots & {"stable_baselines3", "sb3_contrib"}:
        from auturi.adapters.sb3 import wrap_sb3  # lazy: keeps `import auturi` torch-free

        return wrap_sb3(obj, **kwargs)
    raise TypeError(f"auturi.wrap supports Stable-Baselines3 models (PPO, A2C); got {type(obj).__name__}. "
                    f"For anything else build an executor with auturi.make_executor(...)")


def unwrap(model):
    """Undo :func:`wrap`: close the executor and restore the model's own collection loop."""
    from auturi.adapters.sb3 import unwrap_sb3

    return unwrap_sb3(model)

__all__ = [
    "Config", "AuturiError", "ConfigError", "WorkerError", "Executor", "make_executor", "Policy",
    "ConstantPolicy", "RandomPolicy", "TorchPolicy", "Rollout", "CollectStats", "Tuner", "OnlineTuner",
    "TuneResult", "SearchSpace", "build_space", "wrap", "unwrap", "__version__",
]
