"""Lanes that run in the calling process: the serial backend's only kind, and the shm
backend's when a knob is 1 (degree 1: envs step in the actor; 1 replica: inference in the actor)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from auturi.executor.env_runner import EnvRunner
from auturi.executor.policy_runner import PolicyRunner


class LocalEnvLane:
    remote = False

    def __init__(self, runner: EnvRunner, name: str = "local envs"):
        self.runner, self.name = runner, name

    def submit(self, ts: Sequence[int], ids: Sequence[int]) -> None:
        self.runner.step(ts, ids)


class LocalPolicyLane:
    remote = False

    def __init__(self, runner: PolicyRunner, name: str = "local policy"):
        self.runner, self.name = runner, name

    def submit(self, ts: Sequence[int], ids: Sequence[int]) -> None:
        self.runner.act(np.asarray(ts), np.asarray(ids))
