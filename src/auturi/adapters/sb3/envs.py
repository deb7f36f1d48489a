"""The SB3 face's env side: the per-env wrappers workers apply (:class:`EpisodeMonitor`,
:class:`FrameStack`, :class:`TransposeImage`), the picklable recipe :class:`EnvFactory`, and
the recovery of recipes from a model's VecEnv (:func:`factories_from_vecenv`,
:func:`split_vec_wrappers`).

Env workers unpickle :class:`EnvFactory` from this module: it imports neither torch nor SB3
at import time.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from auturi.errors import AuturiError

ENV_FN_HINT = ("pass env_fn=, a zero-argument callable returning ONE gymnasium.Env as your VecEnv builds it "
               "(before any VecEnv wrapper), e.g. auturi.wrap(model, env_fn=lambda: Monitor(MyEnv(size=10))); "
               "it must be importable or picklable (cloudpickle), since workers call it in other processes")


class EnvRebuildError(AuturiError, ValueError):
    """The model's envs cannot be re-created in another process; the message says why and
    how to pass ``env_fn=``."""


# =============================================================================== env side
# Everything in this section runs in env workers: no torch, no SB3 at import.

class EpisodeMonitor(gym.Wrapper):
    """The episode statistics of SB3's ``Monitor`` without importing SB3 (and torch): at an
    episode's end ``info["episode"] = {"r", "l", "t"}`` plus ``info_keywords``, as Monitor
    writes them. It keeps Monitor's per-episode lists too.

    ``t_start``: the time ``"t"`` counts from. A re-created monitor (in a worker, again
    after each reconfigure) gets the user's monitor's, so ``"t"`` keeps counting from when
    training's env was made instead of restarting at each reconfigure."""

    def __init__(self, env: gym.Env, info_keywords: Sequence[str] = (), t_start: float | None = None):
        super().__init__(env)
        self.t_start = time.time() if t_start is None else float(t_start)
        self.info_keywords = tuple(info_keywords)
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
            ep_info = {"r": round(ep_rew, 6), "l": ep_len, "t": round(time.time() - self.t_start, 6)}
            for key in self.info_keywords:
                ep_info[key] = info[key]
            self.episode_returns.append(ep_rew)
            self.episode_lengths.append(ep_len)
            self.episode_times.append(time.time() - self.t_start)
            info["episode"] = ep_info
        self.total_steps += 1
        return obs, reward, terminated, truncated, info


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


def _atari_kwargs(chain: list[gym.Env]) -> dict[str, Any]:
    """AtariWrapper's constructor kwargs, read back from the wrappers it stacked."""
    names = {type(w).__name__: w for w in chain}
    kw: dict[str, Any] = {
        "noop_max": names["NoopResetEnv"].noop_max if "NoopResetEnv" in names else 0,
        "frame_skip": names["MaxAndSkipEnv"]._skip if "MaxAndSkipEnv" in names else 1,
        "terminal_on_life_loss": "EpisodicLifeEnv" in names,
        "clip_reward": "ClipRewardEnv" in names,
        "action_repeat_probability": (names["StickyActionEnv"].action_repeat_probability
                                      if "StickyActionEnv" in names else 0.0),
    }
    warp = names.get("WarpFrame")
    if warp is not None:
        if warp.width != warp.height:
            raise EnvRebuildError(f"AtariWrapper with a non-square frame ({warp.width}x{warp.height}) cannot be "
                                  f"rebuilt; {ENV_FN_HINT}")
        kw["screen_size"] = warp.width
    return kw


class EnvFactory:
    """A picklable recipe for one env: a base (``("make", EnvSpec)``, ``("pickle", bytes)``
    or ``("fn", callable)``) and wrapper layers applied inside out. Calling it builds the env.
    Layers: ``("kwargs", cls, kwargs)``, ``("monitor", info_keywords[, t_start])``,
    ``("sb3_monitor", kwargs[, t_start])``, ``("atari", kwargs)``, ``("framestack", n, channels_first)``,
    ``("transpose",)``."""

    def __init__(self, base: tuple, layers: Sequence[tuple] = (), name: str = "env"):
        self.base = base
        self.layers = list(layers)
        self.name = name

    def with_layers(self, layers: Sequence[tuple]) -> EnvFactory:
        return EnvFactory(self.base, self.layers + list(layers), self.name)

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
        return EpisodeMonitor(env, info_keywords=layer[1], t_start=layer[2] if len(layer) > 2 else None)
    if kind == "sb3_monitor":
        return _sb3_monitor(env, layer[1], layer[2] if len(layer) > 2 else None)
    if kind == "atari":
        from stable_baselines3.common.atari_wrappers import AtariWrapper

        return AtariWrapper(env, **layer[1])
    if kind == "framestack":
        return FrameStack(env, layer[1], layer[2])
    if kind == "transpose":
        return TransposeImage(env)
    raise ValueError(f"unknown env layer {layer!r}")


# =========================================================================== env recovery
def _gym_chain(env: gym.Env) -> list[gym.Env]:
    """The wrappers of ``env``, outermost first, then the unwrapped env."""
    chain = [env]
    while isinstance(chain[-1], gym.Wrapper):
        chain.append(chain[-1].env)
    return chain


def _base_recipe(base: gym.Env, where: str) -> tuple:
    spec = getattr(base, "spec", None)
    if spec is not None and getattr(spec, "id", None) in gym.registry:
        return ("make", spec)
    return _pickled(base, where, "was not made from a registered gymnasium id")


def _pickled(env: gym.Env, where: str, why: str) -> tuple:
    """A copy of the live ``env`` instance (with everything it wraps), as SB3's SubprocVecEnv
    would ship its factory: cloudpickle. A class defined in the training script pickles by
    value."""
    import cloudpickle

    try:
        blob = cloudpickle.dumps(env)
        copy = cloudpickle.loads(blob)
    except Exception as exc:
        raise EnvRebuildError(
            f"{where}: the env {type(env).__name__} {why} and cannot be copied to another process by pickling "
            f"({type(exc).__name__}: {exc}); {ENV_FN_HINT}") from exc
    try:
        copy.close()
    except Exception:  # noqa: BLE001
        pass
    return ("pickle", blob)


def _recipe_from_env(env: gym.Env, where: str) -> EnvFactory:
    """A factory that rebuilds ``env`` (a gymnasium env with its wrappers) elsewhere."""
    chain = _gym_chain(env)
    base = chain[-1]
    layers: list[tuple] = []
    recipe: tuple | None = None  # a pickled copy of an unrecorded wrapper and all inside it
    wrappers = chain[:-1][::-1]  # innermost first
    k = 0
    atari_inner = {"StickyActionEnv", "NoopResetEnv", "MaxAndSkipEnv", "EpisodicLifeEnv", "FireResetEnv",
                   "WarpFrame", "ClipRewardEnv"}
    while k < len(wrappers):
        w = wrappers[k]
        cls = type(w)
        mod = cls.__module__
        if cls.__name__ == "Monitor" and mod.startswith("stable_baselines3"):
            if w.reset_keywords:
                raise NotImplementedError(f"{where}: Monitor(reset_keywords={w.reset_keywords}) needs keywords at "
                                          f"reset, which the executor does not pass; {ENV_FN_HINT}")
            if w.results_writer is not None:
                fname = w.results_writer.file_handler.name
                stem = fname.removesuffix(".monitor.csv")
                layers.append(("sb3_monitor", {"filename": stem, "info_keywords": tuple(w.info_keywords),
                                               "allow_early_resets": True}, float(w.t_start)))
            else:
                layers.append(("monitor", tuple(w.info_keywords), float(w.t_start)))
        elif mod.startswith("stable_baselines3.common.atari_wrappers") and cls.__name__ in atari_inner:
            # The wrappers AtariWrapper stacks; an AtariWrapper layer must follow them.
            j = k
            while j < len(wrappers) and type(wrappers[j]).__name__ in atari_inner:
                j += 1
            if j == len(wrappers) or type(wrappers[j]).__name__ != "AtariWrapper":
                raise EnvRebuildError(f"{where}: SB3 Atari wrappers used without AtariWrapper cannot be rebuilt; "
                                      f"{ENV_FN_HINT}")
            layers.append(("atari", _atari_kwargs(wrappers[k:j])))
            k = j  # skip the AtariWrapper itself
        elif isinstance(w, gym.utils.RecordConstructorArgs) and hasattr(w, "_saved_kwargs"):
            kw = {key: v for key, v in w._saved_kwargs.items() if key != "env"}
            layers.append(("kwargs", cls, kw))
        else:
            # A wrapper whose arguments are not recorded (one written in the training script):
            # copy it, with all it wraps, as one pickled base; the layers inside it go with it.
            why = (f"is a wrapper ({cls.__module__}.{cls.__name__}) whose constructor arguments are not recorded "
                   f"(gymnasium wrappers that subclass gymnasium.utils.RecordConstructorArgs are)")
            recipe, layers = _pickled(w, where, why), []
        k += 1
    name = base.spec.id if getattr(base, "spec", None) is not None else type(base).__name__
    return EnvFactory(recipe if recipe is not None else _base_recipe(base, where), layers, name=name)


def factories_from_vecenv(venv: Any) -> list[EnvFactory]:
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    if isinstance(venv, DummyVecEnv):
        return [_recipe_from_env(e, f"env {i} of the model's DummyVecEnv") for i, e in enumerate(venv.envs)]
    if isinstance(venv, SubprocVecEnv):
        # The envs live in SubprocVecEnv's own processes: rebuild from their gymnasium spec.
        specs = venv.get_attr("spec")
        monitored = venv.env_is_wrapped(_sb3_monitor_class())
        mon_ids = [i for i, m in enumerate(monitored) if m]
        t_starts = dict(zip(mon_ids, venv.get_attr("t_start", indices=mon_ids))) if mon_ids else {}
        out = []
        for i, (spec, mon) in enumerate(zip(specs, monitored)):
            if spec is None or spec.id not in gym.registry:
                raise EnvRebuildError(f"env {i} of the model's SubprocVecEnv was not made from a registered gymnasium "
                                      f"id; {ENV_FN_HINT}")
            wrappers = list(spec.additional_wrappers)
            is_monitor = [w.entry_point.startswith("stable_baselines3.common.monitor") for w in wrappers]
            extra = [w for w, m in zip(wrappers, is_monitor) if not m]
            # Rebuildable: wrappers with recorded kwargs, and at most one Monitor, outermost.
            if any(w.kwargs is None for w in extra) or sum(is_monitor) != int(mon) or (mon and not is_monitor[-1]):
                raise EnvRebuildError(f"env {i} of the model's SubprocVecEnv has wrappers that cannot be re-created "
                                      f"({[w.name for w in spec.additional_wrappers]}); {ENV_FN_HINT}")
            import dataclasses

            base_spec = dataclasses.replace(spec, additional_wrappers=tuple(extra))
            layers = [("monitor", (), float(t_starts[i]))] if mon else []
            out.append(EnvFactory(("make", base_spec), layers, name=spec.id))
        return out
    raise EnvRebuildError(f"the model's VecEnv is a {type(venv).__name__}; auturi.wrap can rebuild the envs of a "
                          f"DummyVecEnv or SubprocVecEnv only; {ENV_FN_HINT}")


def _sb3_monitor_class() -> type:
    from stable_baselines3.common.monitor import Monitor

    return Monitor


def split_vec_wrappers(venv: Any) -> tuple[Any, list[tuple], Any]:
    """Walk the VecEnv wrappers: returns (base VecEnv, per-env layers inside out, VecNormalize or None)."""
    from stable_baselines3.common.vec_env import (
        VecEnvWrapper,
        VecFrameStack,
        VecMonitor,
        VecNormalize,
        VecTransposeImage,
    )

    chain = []
    while isinstance(venv, VecEnvWrapper):
        chain.append(venv)
        venv = venv.venv
    layers: list[tuple] = []
    vecnorm = None
    for pos, w in enumerate(chain):  # outermost first
        if isinstance(w, VecNormalize):
            if pos != 0:
                raise NotImplementedError(
                    f"VecNormalize must be the outermost VecEnv wrapper for auturi.wrap (found under "
                    f"{type(chain[0]).__name__}); build the VecEnv as VecNormalize(VecFrameStack(...)) instead")
            if isinstance(w.observation_space, gym.spaces.Dict):
                raise NotImplementedError("VecNormalize with Dict observations is not supported by auturi.wrap")
            vecnorm = w
        elif isinstance(w, VecFrameStack):
            if isinstance(w.observation_space, gym.spaces.Dict):
                raise NotImplementedError("VecFrameStack with Dict observations is not supported by auturi.wrap")
            layers.insert(0, ("framestack", w.stacked_obs.n_stack, bool(w.stacked_obs.channels_first)))
        elif isinstance(w, VecTransposeImage):
            if not w.skip:
                if isinstance(w.observation_space, gym.spaces.Dict):
                    raise NotImplementedError("VecTransposeImage with Dict observations is not supported by auturi.wrap")
                layers.insert(0, ("transpose",))
        elif isinstance(w, VecMonitor):
            if w.results_writer is not None:
                raise NotImplementedError(
                    "VecMonitor(filename=...) is not supported by auturi.wrap: wrap each env in "
                    "Monitor(env, filename) instead (make_vec_env(..., monitor_dir=...) does)")
            layers.insert(0, ("monitor", tuple(w.info_keywords), float(w.t_start)))
        else:
            raise NotImplementedError(
                f"the VecEnv wrapper {type(w).__name__} is not supported by auturi.wrap (supported: VecNormalize "
                f"as the outermost wrapper, VecFrameStack, VecTransposeImage, VecMonitor). Apply its per-env "
                f"equivalent as a gymnasium wrapper inside your env (and pass env_fn=), or train without auturi")
    return venv, layers, vecnorm


def same_space(a: gym.Space, b: gym.Space) -> bool:
    try:
        if a == b:
            return True
    except Exception:  # noqa: BLE001
        pass
    return type(a) is type(b) and getattr(a, "shape", None) == getattr(b, "shape", None) and \
        getattr(a, "dtype", None) == getattr(b, "dtype", None)


