"""Policies and envs for the executor tests (importable by worker processes)."""
from __future__ import annotations

import os
import signal

import gymnasium as gym
import numpy as np

from auturi.envs import CountingEnv, FaultyEnv


class ObsHashPolicy:
    """Deterministic and batch-independent: the action depends on the observation and the
    noise of its own row only. Its weight ``w`` is added to a reported extra."""

    def __init__(self, action_space: gym.Space):
        self.space = action_space
        self.noise_dim = 1
        self.w = np.zeros((), np.float64)

    def act(self, obs, noise):
        flat = obs.reshape(len(obs), -1).astype(np.float64)
        h = flat.sum(axis=1) * 0.37 + noise[:, 0]
        extras = {"values": (h * 0.5 + self.w).astype(np.float32), "log_probs": -h.astype(np.float32)}
        if isinstance(self.space, gym.spaces.Discrete):
            return (np.floor(np.abs(h) * 7) % self.space.n).astype(np.int64), extras
        if isinstance(self.space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
            n = self.space.nvec if isinstance(self.space, gym.spaces.MultiDiscrete) else 2
            k = np.floor(np.abs(h)[:, None] * (7 + np.arange(np.prod(self.space.shape))))
            return (k % n).astype(self.space.dtype), extras  # int64, int8: each env gets this dtype
        a = np.sin(h)[:, None] * np.ones((1, *self.space.shape))
        return a.astype(np.float32), extras

    def get_state(self):
        return {"w": self.w.copy()}

    def load_state(self, state):
        self.w = np.asarray(state["w"], np.float64).copy()

    def to(self, device):
        pass


class RaisingPolicy(ObsHashPolicy):
    """Raises once ``w`` is set to 1 (so the probe call at construction succeeds)."""

    def act(self, obs, noise):
        if self.w == 1:
            raise ValueError("RaisingPolicy fails on purpose")
        return super().act(obs, noise)


class SuicideEnv(CountingEnv):
    """SIGKILLs its own process at step ``kill_step`` (only outside the caller's process)."""

    def __init__(self, kill_step: int, main_pid: int):
        super().__init__()
        self.kill_step, self.main_pid, self._n = kill_step, main_pid, 0

    def step(self, action):
        self._n += 1
        if self._n >= self.kill_step and os.getpid() != self.main_pid:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


class WorkerOnlyFaultyEnv(FaultyEnv):
    """A FaultyEnv whose faults fire only outside the caller's process."""

    def __init__(self, main_pid: int, **kw):
        super().__init__(**kw)
        if os.getpid() == main_pid:
            self.fail_step = self.fail_reset = None


class TorchProbeEnv(CountingEnv):
    """Reports in its info whether torch is loaded in the process stepping it."""

    def step(self, action):
        import sys

        obs, r, te, tr, info = super().step(action)
        info["torch_loaded"] = "torch" in sys.modules
        info["pid"] = os.getpid()
        return obs, r, te, tr, info


class ModuleProbeEnv(CountingEnv):
    """At each step writes ``<directory>/<pid>``: ``1`` if ``module`` is loaded in the process
    stepping it, else ``0``."""

    def __init__(self, module: str, directory: str):
        super().__init__()
        self.module, self.directory = module, directory

    def step(self, action):
        import sys

        with open(os.path.join(self.directory, str(os.getpid())), "w") as f:
            f.write("1" if self.module in sys.modules else "0")
        return super().step(action)


class BlockingEnv(CountingEnv):
    """At step ``block_step``, outside the caller's process, writes ``<directory>/<pid>`` and
    then blocks reading the FIFO ``<directory>/fifo`` (made by the test): a step that never
    ends, until its process is killed."""

    def __init__(self, directory: str, block_step: int, main_pid: int):
        super().__init__()
        self.directory, self.block_step, self.main_pid, self._n = directory, block_step, main_pid, 0

    def step(self, action):
        self._n += 1
        if self._n == self.block_step and os.getpid() != self.main_pid:
            with open(os.path.join(self.directory, str(os.getpid())), "w"):
                pass
            with open(os.path.join(self.directory, "fifo")) as f:  # blocks: nobody writes
                f.read()
        return super().step(action)


class MisbehavingEnv(CountingEnv):
    """Breaks gymnasium's API or its observation space in one way, ``fault``:
    ``old_step`` (gym<0.26 4-tuple step), ``old_reset`` (obs-only reset), ``short_obs``
    (shape (1,) from step: numpy broadcasts it into (4,) silently), ``long_reset_obs``
    (shape (5,) from reset), ``huge`` (float64 1e300 in a float32 Box at every step),
    ``array_reward`` or ``no_info`` (None for the info dict)."""

    def __init__(self, fault: str):
        super().__init__()
        self.fault = fault

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        if self.fault == "old_reset":
            return obs
        if self.fault == "long_reset_obs":
            return np.zeros(5, np.float32), info
        return obs, info

    def step(self, action):
        obs, r, te, tr, info = super().step(action)
        if self.fault == "old_step":
            return obs, r, te or tr, info
        if self.fault == "short_obs":
            obs = obs[:1]
        elif self.fault == "huge":
            obs = obs.astype(np.float64)
            obs[1] = 1e300
        elif self.fault == "array_reward":
            r = np.array([r, r])
        elif self.fault == "no_info":
            info = None
        return obs, r, te, tr, info
