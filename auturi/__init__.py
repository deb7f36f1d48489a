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

__all__ = [
    "Config", "AuturiError", "ConfigError", "WorkerError", "Executor", "make_executor", "Policy",
    "ConstantPolicy", "RandomPolicy", "TorchPolicy", "Rollout", "CollectStats", "Tuner", "OnlineTuner",
    "TuneResult", "SearchSpace", "build_space", "__version__",
]
