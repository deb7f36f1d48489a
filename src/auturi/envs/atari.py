"""The standard Atari workload: an ALE id with the preprocessing Atari agents train on.

``auturi tune ALE/Pong-v5`` tunes this, not the raw 210x160x3 frames nobody trains on (raw
frames: ``--raw-frames``). The recipe is SB3's and EnvPool's: the id made with
``frameskip=1``, then gymnasium's ``AtariPreprocessing(frame_skip=4, screen_size=84,
grayscale_obs=True, noop_max=30)`` and ``FrameStackObservation(4)``: observations
``(4, 84, 84)`` uint8, which ``--policy cnn`` (Nature CNN) takes.

Its own module, apart from :mod:`auturi.envs`, because only the command line applies it by
default (from Python, pass ``AtariPreprocessed("ALE/Pong-v5")`` as the env); like
that package it must not import torch (env workers unpickle the factory and import this).
"""
from __future__ import annotations

import importlib.util

import gymnasium as gym

from auturi.envs import ProcessTreeEnvFn

__all__ = ["AtariPreprocessed", "RECIPE", "is_ale_id"]

RECIPE = "AtariPreprocessing(frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30) + FrameStackObservation(4)"
"""The preprocessing, as written in the record and the CLI's output."""


def is_ale_id(env_id: str) -> bool:
    """Whether ``env_id`` (registered) is made by ale-py: ``ALE/Pong-v5``, ``PongNoFrameskip-v4``."""
    try:
        entry = gym.spec(env_id).entry_point
    except gym.error.Error:
        return False
    name = entry if isinstance(entry, str) else f"{getattr(entry, '__module__', '')}:"
    return name.startswith("ale_py")


class AtariPreprocessed(ProcessTreeEnvFn):
    """A picklable factory: ``gym.make(env_id, frameskip=1)`` with :data:`RECIPE`. It imports
    ``ale_py`` (which registers the ids) wherever it runs, env workers included."""

    def __init__(self, env_id: str):
        super().__init__()
        self.game_id = env_id  # not ``env_id``: the cache would name it as a plain gym.make(id)

    def make(self) -> gym.Env:
        import ale_py

        gym.register_envs(ale_py)
        if importlib.util.find_spec("cv2") is None:  # AtariPreprocessing resizes with OpenCV
            raise gym.error.DependencyNotInstalled(
                "the Atari preprocessing needs OpenCV: pip install opencv-python-headless (or use raw frames)")
        from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

        env = gym.make(self.game_id, frameskip=1)  # AtariPreprocessing skips frames itself
        env = AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)
        return FrameStackObservation(env, 4)

    def __repr__(self) -> str:
        # Stable (no address): the results cache keys the workload by it.
        return f"AtariPreprocessed({self.game_id!r}, {RECIPE})"
