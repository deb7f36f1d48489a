"""An env module whose constructor reads a module-level setting that a training script sets
at run time (for tests/test_sb3_user_paths.py; not a test module: env workers import it)."""
import gymnasium as gym
import numpy as np

SETTINGS = {"bonus": 0.0}


class BonusEnv(gym.Env):
    """Rewards ``1 + bonus`` at every step, ``bonus`` read from :data:`SETTINGS` when made."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.bonus = SETTINGS["bonus"]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 1.0 + self.bonus, False, False, {}


ID = "AuturiSettingProbe-v0"
"""Registered at import (processes that never ran the test import this module by the id's
``tests.setting_probe_env:`` prefix)."""
if ID not in gym.registry:
    gym.register(ID, entry_point="tests.setting_probe_env:BonusEnv", max_episode_steps=50)
