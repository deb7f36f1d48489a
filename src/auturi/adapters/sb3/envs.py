"""The SB3 face's env side: the per-env wrappers workers apply (:class:`EpisodeMonitor`,
:class:`FrameStack`, :class:`TransposeImage`) and the picklable recipe :class:`EnvFactory`
(its layers: :func:`_apply_layer`). :mod:`.recover` makes the recipes from a model's VecEnv.

Env workers unpickle :class:`EnvFactory` from this module: it imports neither torch nor SB3
at import time.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from auturi.envs import entry_point_modules
from auturi.errors import AuturiError

ENV_FN_HINT = ("pass env_fn=, a zero-argument callable returning ONE gymnasium.Env as your VecEnv builds it "
               "(before any VecEnv wrapper), e.g. auturi.wrap(model, env_fn=lambda: Monitor(MyEnv(size=10))); "
               "it must be importable or picklable (cloudpickle), since workers call it in other processes")


class EnvRebuildError(AuturiError, ValueError):
    """The model's envs cannot be re-created in another process; the message says why and
    how to pass ``env_fn=``."""


# Everything here runs in env workers: no torch, no SB3 at import.

class EpisodeMonitor(gym.Wrapper):
    """The episode statistics of SB3's ``Monitor`` without importing SB3 (and torch): at an
    episode's end ``info["episode"] = {"r", "l", "t"}`` plus ``info_keywords``, as Monitor
    writes them. It keeps Monitor's per-episode lists too.

    ``t_start``: the time ``"t"`` counts from. A re-created monitor (in a worker, again
    after each reconfigure) gets the user's monitor's, so ``"t"`` keeps counting from when
    training's env was made instead of restarting at each reconfigure.

    ``vec_sums``: it stands for SB3's ``VecMonitor`` instead, which sums the VecEnv's rewards
    (``"float32"``: a DummyVecEnv's; ``"float64"``: a SubprocVecEnv's) into a float32 return
    and an int32 length, unrounded: ``"r"`` and ``"l"`` are those (Monitor's sum, rounded to
    6 digits, differed from VecMonitor's in the 7th, 2026-11-27)."""

    def __init__(self, env: gym.Env, info_keywords: Sequence[str] = (), t_start: float | None = None,
                 vec_sums: str | None = None):
        super().__init__(env)
        self.t_start = time.time() if t_start is None else float(t_start)
        self.info_keywords = tuple(info_keywords)
        self.vec_sums = None if vec_sums is None else np.dtype(vec_sums).type
        self.rewards: list[float] = []
        self.episode_returns: list[float] = []
        self.episode_lengths: list[int] = []
        self.episode_times: list[float] = []
        self.total_steps = 0

    def reset(self, **kwargs: Any):
        self.rewards = []
        return self.env.reset(**kwargs)

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.rewards.append(float(reward))
        if terminated or truncated:
            ep_rew, ep_len = sum(self.rewards), len(self.rewards)
            ep_info = {"r": round(ep_rew, 6) if self.vec_sums is None else self._vec_return(),
                       "l": ep_len if self.vec_sums is None else np.int32(ep_len),
                       "t": round(time.time() - self.t_start, 6)}
            for key in self.info_keywords:
                ep_info[key] = info[key]
            self.episode_returns.append(ep_rew)
            self.episode_lengths.append(ep_len)
            self.episode_times.append(time.time() - self.t_start)
            info["episode"] = ep_info
        self.total_steps += 1
        return obs, reward, terminated, truncated, info

    def _vec_return(self) -> np.float32:
        """VecMonitor's return: ``ret += reward`` step by step in a float32 array, the rewards
        of the VecEnv's dtype (``vec_sums``)."""
        ret = np.float32(0.0)
        for r in self.rewards:
            ret = np.float32(ret + self.vec_sums(r))
        return ret

    # Monitor's getters, for env_method("get_episode_rewards") on a wrapped model's VecEnv.
    def get_total_steps(self) -> int:
        return self.total_steps

    def get_episode_rewards(self) -> list[float]:
        return self.episode_returns

    def get_episode_lengths(self) -> list[int]:
        return self.episode_lengths

    def get_episode_times(self) -> list[float]:
        return self.episode_times


class FrameStack(gym.Wrapper):
    """SB3's ``VecFrameStack`` for one env, same layout: ``n_stack`` frames concatenated on
    the last axis (``channels_first=False``) or the first, the newest last, zeros before the
    first frame of an episode. The observation returned at an episode's end is the stack
    that ends with the final frame, which is SB3's ``terminal_observation``."""

    def __init__(self, env: gym.Env, n_stack: int, channels_first: bool):
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box):
            raise TypeError(f"FrameStack needs a Box observation space, not {space}")
        self.n_stack, self.channels_first = int(n_stack), bool(channels_first)
        self.axis = 0 if self.channels_first else -1
        self.frame = space.shape[self.axis]
        low = np.repeat(space.low, self.n_stack, axis=self.axis)
        high = np.repeat(space.high, self.n_stack, axis=self.axis)
        self.observation_space = gym.spaces.Box(low=low, high=high, dtype=space.dtype)
        self.stack = np.zeros(self.observation_space.shape, dtype=space.dtype)

    def _put(self, obs: Any) -> np.ndarray:
        if self.channels_first:
            self.stack[-self.frame:, ...] = obs
        else:
            self.stack[..., -self.frame:] = obs
        return self.stack.copy()

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self.stack[...] = 0
        return self._put(obs), info

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.stack = np.roll(self.stack, -self.frame, axis=self.axis)
        return self._put(obs), reward, terminated, truncated, info


class TransposeImage(gym.ObservationWrapper):
    """SB3's ``VecTransposeImage`` for one env: HxWxC -> CxHxW."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        h, w, c = space.shape
        self.observation_space = gym.spaces.Box(low=0, high=255, shape=(c, h, w), dtype=space.dtype)

    def observation(self, observation: Any) -> np.ndarray:
        return np.transpose(observation, (2, 0, 1))


class EnvFactory:
    """A picklable recipe for one env: a base (``("make", EnvSpec)``, ``("pickle", bytes)``
    or ``("fn", callable)``) and wrapper layers applied inside out. Calling it builds the env.
    Layers: ``("kwargs", cls, kwargs)``, ``("monitor", info_keywords[, t_start])``,
    ``("sb3_monitor", kwargs[, t_start])``, ``("atari", kwargs)``, ``("framestack", n, channels_first)``,
    ``("transpose",)``, ``("state", bytes)`` (a wrapper copied without its env)."""

    def __init__(self, base: tuple, layers: Sequence[tuple] = (), name: str = "env"):
        self.base = base
        self.layers = list(layers)
        self.name = name

    def with_layers(self, layers: Sequence[tuple]) -> EnvFactory:
        return EnvFactory(self.base, self.layers + list(layers), self.name)

    def for_timing(self) -> EnvFactory:
        """This recipe with SB3's file ``Monitor`` swapped for the in-memory one: the tuner
        times env 0 with random actions (:func:`auturi.tuner.timing.time_env`), and those
        episodes must not land in the user's ``monitor_dir`` beside the learner's (learning
        curves read every line of it). The two cost the same per step but the file's writes."""
        layers = [("monitor", tuple(layer[1].get("info_keywords", ())), *layer[2:]) if layer[0] == "sb3_monitor"
                  else layer for layer in self.layers]
        return EnvFactory(self.base, layers, self.name)

    @property
    def preload_modules(self) -> tuple[str, ...]:
        """The modules calling this recipe imports that its pickle does not name: the env
        class of a ``("make", spec)`` base and SB3's wrappers (imported in :func:`_apply_layer`).
        A worker's forkserver preloads them (:func:`auturi.executor.shm.forkservers.modules_to_preload`):
        SB3's modules import torch, seconds of a core that each env worker paid on its own.

        >>> EnvFactory(("make", gym.spec("CartPole-v1")), [("atari", {})]).preload_modules
        ('gymnasium.envs.classic_control.cartpole', 'stable_baselines3.common.atari_wrappers')
        """
        mods: list[str] = []
        if self.base[0] == "make":
            mods += entry_point_modules(self.base[1])
        elif self.base[0] == "fn":
            mods += getattr(self.base[1], "preload_modules", ())
        mods += [_LAYER_MODULES[layer[0]] for layer in self.layers if layer[0] in _LAYER_MODULES]
        return tuple(dict.fromkeys(mods))

    def __call__(self) -> gym.Env:
        kind = self.base[0]
        if kind == "make":
            env = gym.make(self.base[1])
        elif kind == "pickle":
            import cloudpickle

            env = cloudpickle.loads(self.base[1])
        else:
            env = self.base[1]()
        for layer in self.layers:
            env = _apply_layer(env, layer)
        return env

    def __repr__(self) -> str:
        return f"EnvFactory({self.name}, layers={[layer[0] for layer in self.layers]})"


_LAYER_MODULES = {"atari": "stable_baselines3.common.atari_wrappers", "sb3_monitor": "stable_baselines3.common.monitor"}
"""The module each SB3 layer of :class:`EnvFactory` imports when it is applied."""


def _sb3_monitor(env: gym.Env, kwargs: Mapping[str, Any], t_start: float | None) -> gym.Env:
    """SB3's ``Monitor`` writing to the user's file. The user's own monitor wrote the file's
    header (and its ``t_start``) when training's env was made; this copy is made again in
    every worker and after every reconfigure, so it appends (opening with Monitor's default
    ``override_existing=True`` emptied the file each time: a reconfigure lost every episode
    written before it) and counts ``"t"`` from that same ``t_start``."""
    from stable_baselines3.common.monitor import Monitor

    mon = Monitor(env, **{**kwargs, "override_existing": False})
    if t_start is not None:
        mon.t_start = float(t_start)
    return mon


def _apply_layer(env: gym.Env, layer: tuple) -> gym.Env:
    kind = layer[0]
    if kind == "kwargs":
        return layer[1](env, **layer[2])
    if kind == "monitor":
        return EpisodeMonitor(env, info_keywords=layer[1], t_start=layer[2] if len(layer) > 2 else None,
                              vec_sums=layer[3] if len(layer) > 3 else None)
    if kind == "sb3_monitor":
        return _sb3_monitor(env, layer[1], layer[2] if len(layer) > 2 else None)
    if kind == "atari":
        from stable_baselines3.common.atari_wrappers import AtariWrapper

        return AtariWrapper(env, **layer[1])
    if kind == "framestack":
        return FrameStack(env, layer[1], layer[2])
    if kind == "transpose":
        return TransposeImage(env)
    if kind == "state":  # a copy of a wrapper over the env rebuilt inside it (see _detached)
        import cloudpickle

        cls, state = cloudpickle.loads(layer[1])
        wrapper = cls.__new__(cls)
        wrapper.__dict__.update(state)
        wrapper.env = env
        return wrapper
    raise ValueError(f"unknown env layer {layer!r}")
