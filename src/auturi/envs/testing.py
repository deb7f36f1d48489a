"""Test envs that stand in for real simulators, and their gymnasium ids ``auturi/<Name>-v0``.

Deterministic and cheap (:class:`CountingEnv` and its variants), or with a controlled cost
(:class:`SlowEnv`, :class:`HeavyTailEnv`, :class:`LargeObsEnv`) or fault (:class:`FaultyEnv`).
Tests, the bench and the docs use them; :mod:`auturi.envs` re-exports them. The id
``auturi/EmulatedSim-v0`` names :class:`auturi.testing.emulated_sim.EmulatedSimEnv` (a simulator
on other cores, emulated by waiting), imported only when that id is made.

This module must not import torch: env workers import it.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import gymnasium as gym
import numpy as np

ACTION_SPACES: dict[str, Callable[[], gym.Space]] = {
    "discrete": lambda: gym.spaces.Discrete(3),
    "box": lambda: gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
    "multidiscrete": lambda: gym.spaces.MultiDiscrete([3, 4]),
    "multibinary": lambda: gym.spaces.MultiBinary(2),
}


class CountingEnv(gym.Env):
    """A deterministic, cheap env whose observations depend on the whole action history,
    so any misplaced action or mixed-up env shows in the data.

    Episodes last 3 to ``max_len`` steps (drawn at reset), end terminated or truncated at
    random, and carry ``info["env_step"]``. ``obs_shape`` may be an image shape; use
    ``obs_dtype=np.uint8`` for images. ``action`` is ``"discrete"`` (``Discrete(3)``), ``"box"``
    (float32, shape 2), ``"multidiscrete"`` (``MultiDiscrete([3, 4])``) or ``"multibinary"``
    (``MultiBinary(2)``).
    """

    metadata: dict = {"render_modes": []}

    def __init__(self, obs_shape: tuple[int, ...] = (4,), action: str = "discrete", max_len: int = 12,
                 obs_dtype: Any = np.float32, step_seconds: float = 0.0):
        self.obs_dtype = np.dtype(obs_dtype)
        if self.obs_dtype == np.uint8:
            self.observation_space = gym.spaces.Box(0, 255, obs_shape, np.uint8)
        else:
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, obs_shape, self.obs_dtype)
        self.action_space = ACTION_SPACES[action]()
        self.max_len = max_len
        self.step_seconds = step_seconds
        self._rng = np.random.default_rng(0)
        self._state = 0.0
        self._t = 0
        self._len = 3

    def _obs(self) -> np.ndarray:
        base = np.arange(int(np.prod(self.observation_space.shape)), dtype=np.float64)
        v = (base * 0.01 + self._state + self._t).reshape(self.observation_space.shape)
        if self.obs_dtype == np.uint8:
            return (np.abs(v * 7.0) % 256).astype(np.uint8)
        return v.astype(self.obs_dtype)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._state = float(self._rng.integers(0, 1000))
        self._t = 0
        self._len = int(self._rng.integers(3, self.max_len + 1))
        return self._obs(), {}

    def step(self, action):
        if self.step_seconds:
            time.sleep(self.step_seconds)
        a = float(np.sum(action)) if self.action_space.shape else float(action)
        self._state = self._state * 0.5 + a + 0.001 * float(self._rng.random())
        self._t += 1
        reward = a * 0.5 + float(self._rng.random())
        ended = self._t >= self._len
        terminated = ended and bool(self._rng.random() < 0.5)
        truncated = ended and not terminated
        return self._obs(), reward, terminated, truncated, {"env_step": self._t}


class ActionDtypeEnv(CountingEnv):
    """An env that computes with its action, so its next observation depends on the action's
    type and dtype: it shows whether envs get what SB3's ``DummyVecEnv`` hands them.

    A float32 state (2 values) is multiplied by the action. numpy (NEP 50) makes float32
    times an ``np.int64`` scalar, a float64 array or a list float64, and float32 times a
    Python int or a float32 array float32; the state keeps the product's rounding, and the
    observation is ``[state, itemsize of the product, 1 if the action was a numpy value]``.
    Episodes end as :class:`CountingEnv`'s; ``action`` as there.
    """

    def __init__(self, action: str = "discrete", max_len: int = 12):
        super().__init__(obs_shape=(4,), action=action, max_len=max_len)
        self._x = np.zeros(2, np.float32)
        self._flags = np.zeros(2, np.float32)

    def _obs(self) -> np.ndarray:
        return np.concatenate([self._x, self._flags])

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed, options=options)
        self._x = self._rng.random(2).astype(np.float32) + np.float32(self._state % 7)
        self._flags[:] = 0
        return self._obs(), {}

    def step(self, action):
        prod = self._x * action  # the dtype follows the action's type (NEP 50 promotion)
        mixed = self._x * np.float32(0.9) + prod * np.float32(0.37) + np.float32(0.1)
        self._x = mixed.astype(np.float32)  # the rounding of float64 arithmetic stays in the state
        self._flags[:] = (prod.dtype.itemsize, float(isinstance(action, (np.ndarray, np.generic))))
        self._t += 1
        reward = float(prod.sum()) + float(self._rng.random())
        ended = self._t >= self._len
        terminated = ended and bool(self._rng.random() < 0.5)
        return self._obs(), reward, terminated, ended and not terminated, {"env_step": self._t}


class SlowEnv(CountingEnv):
    """Waits about ``step_seconds`` (default 1 ms) per step, as a remote simulator would:
    the time is spent blocked, not computing, so more env workers than cores still help."""

    def __init__(self, step_seconds: float = 1e-3, **kw: Any):
        super().__init__(step_seconds=step_seconds, **kw)


class HeavyTailEnv(CountingEnv):
    """Step time with a heavy tail: usually ``base_seconds``, one step in ``1/tail_prob``
    takes ``tail_factor`` times as long (spin-computed, so it uses the CPU).

    Which steps are slow is drawn per env from its first ``reset`` seed: with one fixed seed
    every env of a vector was slow on the same step, so averaging over envs cancelled nothing
    and the env was ~3x noisier than a real simulator's independent stalls."""

    def __init__(self, base_seconds: float = 5e-5, tail_prob: float = 0.02, tail_factor: float = 50.0, **kw: Any):
        super().__init__(**kw)
        self.base_seconds, self.tail_prob, self.tail_factor = base_seconds, tail_prob, tail_factor
        self._cost_rng = np.random.default_rng(12345)  # until the first seeded reset

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None and not getattr(self, "_cost_seeded", False):
            self._cost_rng = np.random.default_rng([12345, int(seed)])
            self._cost_seeded = True
        return super().reset(seed=seed, options=options)

    def step(self, action):
        cost = self.base_seconds * (self.tail_factor if self._cost_rng.random() < self.tail_prob else 1.0)
        end = time.perf_counter() + cost
        spins = 0
        while time.perf_counter() < end:  # burns CPU on purpose: it models a simulator's compute
            spins += 1
        return super().step(action)


class LargeObsEnv(CountingEnv):
    """An image-like uint8 observation of about 1 MB (3 x 512 x 683 by default)."""

    def __init__(self, obs_shape: tuple[int, ...] = (3, 512, 683), **kw: Any):
        super().__init__(obs_shape=obs_shape, obs_dtype=np.uint8, **kw)


class FaultyEnv(CountingEnv):
    """Raises ``RuntimeError`` in ``step`` at step ``fail_step`` (counting from 1) or in
    ``reset`` at reset ``fail_reset``, for the fault tests."""

    def __init__(self, fail_step: int | None = None, fail_reset: int | None = None, **kw: Any):
        super().__init__(**kw)
        self.fail_step, self.fail_reset = fail_step, fail_reset
        self._steps = 0
        self._resets = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self._resets += 1
        if self.fail_reset is not None and self._resets >= self.fail_reset:
            raise RuntimeError(f"FaultyEnv: reset {self._resets} fails on purpose")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self._steps += 1
        if self.fail_step is not None and self._steps >= self.fail_step:
            raise RuntimeError(f"FaultyEnv: step {self._steps} fails on purpose")
        return super().step(action)


# The test envs under gymnasium ids, so that id-based tools (make_vec_env, `auturi tune`,
# the SB3 wrapper's env rebuilding) can use them like any registered env.
for _name, _cls in (("Counting", "CountingEnv"), ("Slow", "SlowEnv"), ("HeavyTail", "HeavyTailEnv"),
                    ("LargeObs", "LargeObsEnv"), ("ActionDtype", "ActionDtypeEnv")):
    if f"auturi/{_name}-v0" not in gym.registry:
        gym.register(f"auturi/{_name}-v0", entry_point=f"auturi.envs.testing:{_cls}")
# The emulated simulator (a test and bench tool, auturi.testing): registered by its entry point's
# name only, so `import auturi` never imports it; gym.make imports it when the id is made.
if "auturi/EmulatedSim-v0" not in gym.registry:
    gym.register("auturi/EmulatedSim-v0", entry_point="auturi.testing.emulated_sim:EmulatedSimEnv")
