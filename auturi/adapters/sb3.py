"""One line around a Stable-Baselines3 on-policy model: :func:`wrap_sb3`.

Still one module (over 500 lines): env recovery, the policy adapter, the handle and the
rollout replay become a package by role when off-policy algorithms join, so it is split once.

``wrap_sb3(model)`` returns the same ``PPO`` / ``A2C`` object; ``model.learn()``, ``save``,
``predict`` and the logger keep working, but every rollout is collected by an Auturi
executor (and, with ``tune=True``, on a layout the online tuner picks by measurement).

How it fits into SB3:

- the instance's ``collect_rollouts`` is replaced (``types.MethodType``). Each call sends the
  policy weights to the replicas once, runs ``executor.collect(n_steps)``, then *replays* the
  rollout step by step exactly where SB3's loop would: ``num_timesteps``, the callback's
  ``update_locals`` / ``on_step`` (with SB3's local names), ``_update_info_buffer``, the
  bootstrap of truncated episodes (``reward += gamma * V(terminal_obs)``),
  ``rollout_buffer.add`` and ``compute_returns_and_advantage``;
- the envs are rebuilt in the workers from what the user passed (an env id, ``make_vec_env``,
  ``make_atari_env``, a custom env instance), or from ``env_fn=``; SB3's ``Monitor`` is
  re-created (a torch-free copy, :class:`EpisodeMonitor`, unless it writes a file);
- ``VecFrameStack`` and ``VecTransposeImage`` become per-env wrappers with SB3's layout,
  ``VecMonitor`` a per-env monitor, and ``VecNormalize`` is applied in the policy replicas with
  the statistics of the start of the rollout (shipped with the weights), the statistics then
  updated in this process from the raw observations, step by step as SB3 would.

This module does not import torch or SB3 at import time: env workers unpickle its env
factories and must stay torch-free.

Example::

    from stable_baselines3 import PPO
    from auturi.adapters.sb3 import wrap_sb3

    model = wrap_sb3(PPO("MlpPolicy", "CartPole-v1", n_steps=128, seed=0))
    model.learn(20_000)
"""
from __future__ import annotations

import time
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from auturi.config import Config
from auturi.errors import AuturiError
from auturi.adapters.common import check_face_options, tuner_kwargs
from auturi.sampling import categorical_from_uniform, normal_from_uniform

__all__ = [
    "EnvFactory",
    "EnvRebuildError",
    "EpisodeMonitor",
    "FrameStack",
    "SB3Handle",
    "SB3PolicyAdapter",
    "TransposeImage",
    "unwrap_sb3",
    "wrap_sb3",
]

_STATE_PREFIX = "auturi."  # keys of the state that carry VecNormalize statistics, not weights
_ENV_FN_HINT = ("pass env_fn=, a zero-argument callable returning ONE gymnasium.Env as your VecEnv builds it "
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
                                  f"rebuilt; {_ENV_FN_HINT}")
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


# ============================================================================ policy side
class _NoOptimizer:
    """Stands in for SB3's optimizer in the adapter's copies of the network, which never
    train: building Adam imports torch._dynamo on first use (~1.3 s and 800 modules, in each
    replica process, or in the forkserver they fork from)."""

    def __init__(self, params: Any, **kwargs: Any):
        pass


class _ConstantSchedule:
    """A picklable learning-rate schedule (replicas never train; the optimizer SB3 builds
    needs one)."""

    def __init__(self, value: float):
        self.value = float(value)

    def __call__(self, progress_remaining: float) -> float:
        return self.value


_DISTRIBUTIONS = {
    "CategoricalDistribution": "categorical",
    "DiagGaussianDistribution": "gaussian",
    "MultiCategoricalDistribution": "multicategorical",
    "BernoulliDistribution": "bernoulli",
}


class SB3PolicyAdapter:
    """An auturi :class:`~auturi.policy.Policy` that runs an SB3 ``ActorCriticPolicy``.

    Replicas rebuild the network from ``policy_class(observation_space, action_space,
    lr_schedule, **policy_kwargs)`` (kept pickled, so unpickling this object in an env worker
    imports neither torch nor SB3) and load the state the executor publishes: the weights,
    plus ``auturi.obs_mean`` / ``auturi.obs_var`` when ``VecNormalize`` statistics travel too.

    ``act`` does SB3's forward pass (``obs_to_tensor``, features, latents, value, action
    distribution) but samples from the executor's noise: inverse CDF for Categorical (and
    each part of MultiCategorical), ``u < p`` for Bernoulli, ``mean + std * ndtri(u)`` for
    DiagGaussian. Box actions come back clipped to the action space (what the env gets) and
    unclipped in the extra ``raw_actions`` (what SB3 stores). Extras: ``values``,
    ``log_probs``.
    """

    # Imported once in the forkserver replicas fork from, not in each replica process.
    preload_modules = ("stable_baselines3.common.policies",)

    def __init__(self, policy_class: type, observation_space: gym.Space, action_space: gym.Space,
                 policy_kwargs: Mapping[str, Any], distribution: str, *, learning_rate: float = 0.0,
                 deterministic: bool = False, normalize: Mapping[str, float] | None = None,
                 device: str = "cpu"):
        import cloudpickle

        if distribution not in _DISTRIBUTIONS:
            raise NotImplementedError(
                f"auturi.wrap supports SB3 policies whose action distribution is one of "
                f"{sorted(_DISTRIBUTIONS)}; this policy uses {distribution}")
        self._blob = cloudpickle.dumps((policy_class, observation_space, action_space, dict(policy_kwargs),
                                        float(learning_rate)))
        self.kind = _DISTRIBUTIONS[distribution]
        self.action_space = action_space
        self.deterministic = bool(deterministic)
        self.normalize = dict(normalize) if normalize else None  # {"epsilon", "clip_obs"}
        self.device = device
        if self.deterministic:
            self.noise_dim = 0
        elif self.kind == "categorical":
            self.noise_dim = 1
        elif self.kind == "multicategorical":
            self.noise_dim = len(action_space.nvec)
        else:
            self.noise_dim = int(np.prod(action_space.shape))
        if isinstance(action_space, gym.spaces.Box):
            self._low, self._high = action_space.low, action_space.high
        self._net = None
        self._obs_mean: np.ndarray | None = None
        self._obs_var: np.ndarray | None = None

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_net"] = None  # replicas build their own and load the published state
        return d

    @property
    def net(self):
        if self._net is None:
            import cloudpickle
            import torch

            policy_class, obs_space, act_space, kwargs, lr = cloudpickle.loads(self._blob)
            # Building draws initial weights: keep the caller's torch RNG stream untouched.
            with torch.random.fork_rng(devices=[]):
                net = policy_class(obs_space, act_space, _ConstantSchedule(lr),
                                   **{**kwargs, "optimizer_class": _NoOptimizer})
            net.set_training_mode(False)
            self._net = net.to(torch.device(self.device))
        return self._net

    def to(self, device: str) -> None:
        """Move to ``device``. Builds the network now if needed: the executor calls this
        once in each replica while it starts, so torch and SB3 load during the reconfigure
        (in parallel across workers) rather than in the first collect."""
        import torch

        self.device = device
        if self._net is not None:
            self._net.to(torch.device(device))
        else:
            self.net  # noqa: B018 - builds on self.device

    def get_state(self) -> dict[str, np.ndarray]:
        state = {k: v.detach().cpu().numpy().copy() for k, v in self.net.state_dict().items()}
        if self._obs_mean is not None:
            state[_STATE_PREFIX + "obs_mean"] = self._obs_mean.copy()
            state[_STATE_PREFIX + "obs_var"] = self._obs_var.copy()
        return state

    def load_state(self, state: Mapping[str, Any]) -> None:
        import torch

        self.load_obs_stats(state)
        self.net.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in state.items()
                                  if not k.startswith(_STATE_PREFIX)})

    def load_obs_stats(self, state: Mapping[str, Any]) -> None:
        """Take the VecNormalize statistics of ``state`` (if it has them), not its weights."""
        if _STATE_PREFIX + "obs_mean" in state:
            self._obs_mean = np.array(state[_STATE_PREFIX + "obs_mean"], dtype=np.float64)
            self._obs_var = np.array(state[_STATE_PREFIX + "obs_var"], dtype=np.float64)

    def normalize_obs(self, obs: np.ndarray) -> np.ndarray:
        """VecNormalize's ``normalize_obs`` with the shipped statistics (identity without)."""
        if self.normalize is None or self._obs_mean is None:
            return obs
        n = self.normalize
        return np.clip((obs - self._obs_mean) / np.sqrt(self._obs_var + n["epsilon"]),
                       -n["clip_obs"], n["clip_obs"]).astype(np.float32)

    def act(self, obs: np.ndarray, noise: np.ndarray):
        import torch

        net = self.net
        with torch.no_grad():
            obs_t = net.obs_to_tensor(self.normalize_obs(obs))[0]
            features = net.extract_features(obs_t)
            if net.share_features_extractor:
                latent_pi, latent_vf = net.mlp_extractor(features)
            else:
                pi_features, vf_features = features
                latent_pi = net.mlp_extractor.forward_actor(pi_features)
                latent_vf = net.mlp_extractor.forward_critic(vf_features)
            values = net.value_net(latent_vf)
            dist = net._get_action_dist_from_latent(latent_pi)
            if self.deterministic:
                a = dist.get_actions(deterministic=True)
            else:
                a = self._sample(dist, torch.as_tensor(np.ascontiguousarray(noise), device=values.device))
            log_prob = dist.log_prob(a)
            a = a.reshape((-1, *self.action_space.shape))
            actions = a.cpu().numpy()
            extras = {"values": values.reshape(-1).float().cpu().numpy(),
                      "log_probs": log_prob.reshape(-1).float().cpu().numpy()}
        if isinstance(self.action_space, gym.spaces.Box):
            extras["raw_actions"] = actions
            return np.clip(actions, self._low, self._high), extras
        return actions, extras

    def _sample(self, dist: Any, u: Any):
        import torch

        if self.kind == "categorical":
            return categorical_from_uniform(dist.distribution.probs, u[:, 0])
        if self.kind == "multicategorical":
            return torch.stack([categorical_from_uniform(d.probs, u[:, j]) for j, d in enumerate(dist.distribution)],
                               dim=1)
        if self.kind == "bernoulli":
            return (u < dist.distribution.probs).to(dist.distribution.probs.dtype)
        normal = dist.distribution
        return normal_from_uniform(normal.mean, normal.stddev, u)


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
    import cloudpickle

    try:
        blob = cloudpickle.dumps(base)
        copy = cloudpickle.loads(blob)
    except Exception as exc:
        raise EnvRebuildError(
            f"{where}: the env {type(base).__name__} was not made from a registered gymnasium id and cannot be "
            f"copied to another process by pickling ({type(exc).__name__}: {exc}); {_ENV_FN_HINT}") from exc
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
                                          f"reset, which the executor does not pass; {_ENV_FN_HINT}")
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
                                      f"{_ENV_FN_HINT}")
            layers.append(("atari", _atari_kwargs(wrappers[k:j])))
            k = j  # skip the AtariWrapper itself
        elif isinstance(w, gym.utils.RecordConstructorArgs) and hasattr(w, "_saved_kwargs"):
            kw = {key: v for key, v in w._saved_kwargs.items() if key != "env"}
            layers.append(("kwargs", cls, kw))
        else:
            raise EnvRebuildError(
                f"{where}: the wrapper {cls.__module__}.{cls.__name__} cannot be re-created in another process "
                f"(its constructor arguments are not recorded; gymnasium wrappers that subclass "
                f"gymnasium.utils.RecordConstructorArgs are); {_ENV_FN_HINT}")
        k += 1
    name = base.spec.id if getattr(base, "spec", None) is not None else type(base).__name__
    return EnvFactory(_base_recipe(base, where), layers, name=name)


def _factories_from_vecenv(venv: Any) -> list[EnvFactory]:
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
                                      f"id; {_ENV_FN_HINT}")
            wrappers = list(spec.additional_wrappers)
            is_monitor = [w.entry_point.startswith("stable_baselines3.common.monitor") for w in wrappers]
            extra = [w for w, m in zip(wrappers, is_monitor) if not m]
            # Rebuildable: wrappers with recorded kwargs, and at most one Monitor, outermost.
            if any(w.kwargs is None for w in extra) or sum(is_monitor) != int(mon) or (mon and not is_monitor[-1]):
                raise EnvRebuildError(f"env {i} of the model's SubprocVecEnv has wrappers that cannot be re-created "
                                      f"({[w.name for w in spec.additional_wrappers]}); {_ENV_FN_HINT}")
            import dataclasses

            base_spec = dataclasses.replace(spec, additional_wrappers=tuple(extra))
            layers = [("monitor", (), float(t_starts[i]))] if mon else []
            out.append(EnvFactory(("make", base_spec), layers, name=spec.id))
        return out
    raise EnvRebuildError(f"the model's VecEnv is a {type(venv).__name__}; auturi.wrap can rebuild the envs of a "
                          f"DummyVecEnv or SubprocVecEnv only; {_ENV_FN_HINT}")


def _sb3_monitor_class() -> type:
    from stable_baselines3.common.monitor import Monitor

    return Monitor


def _split_vec_wrappers(venv: Any) -> tuple[Any, list[tuple], Any]:
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


def _same_space(a: gym.Space, b: gym.Space) -> bool:
    try:
        if a == b:
            return True
    except Exception:  # noqa: BLE001
        pass
    return type(a) is type(b) and getattr(a, "shape", None) == getattr(b, "shape", None) and \
        getattr(a, "dtype", None) == getattr(b, "dtype", None)


# ================================================================================ handle
def _policy_state(model: Any, vecnorm: Any) -> dict[str, np.ndarray]:
    """What the replicas load: the policy's weights and, with VecNormalize, its observation statistics."""
    state = {k: v.detach().cpu().numpy() for k, v in model.policy.state_dict().items()}
    if vecnorm is not None and vecnorm.norm_obs:
        state[_STATE_PREFIX + "obs_mean"] = np.asarray(vecnorm.obs_rms.mean, dtype=np.float64)
        state[_STATE_PREFIX + "obs_var"] = np.asarray(vecnorm.obs_rms.var, dtype=np.float64)
    return state


class SB3Handle:
    """What :func:`wrap_sb3` attaches to the model as ``model.auturi``: the executor, the
    optional online tuner and the last rollout's stats. ``close()`` ends the workers."""

    def __init__(self, model: Any, executor: Any, adapter: SB3PolicyAdapter, vecnorm: Any, source_env: Any,
                 tuner: Any, seed: int, raw_observation_space: gym.Space):
        self.executor = executor
        self.adapter = adapter
        self.vecnorm = vecnorm
        self.source_env = source_env
        self.tuner = tuner
        self.seed = seed
        self.raw_observation_space = raw_observation_space
        self.last_stats: Any = None
        self.collects = 0
        self.cut_episodes = 0  # episodes a reconfigure cut short (see _restart_cut_episodes)
        self.snapshot: Any = None  # auturi.server.StatusSnapshot, with status_port
        self.server: Any = None    # auturi.server.StatusServer, with status_port
        self._locked_logged = False

    @property
    def config(self) -> Config:
        return self.executor.config

    def state(self, model: Any) -> dict[str, np.ndarray]:
        return _policy_state(model, self.vecnorm)

    def collect(self, model: Any, num_steps: int) -> Any:
        state = self.state(model)
        self.executor.set_policy_state(state)
        # The replay normalises the observations with self.adapter's statistics: they must be
        # the ones the replicas act with in this rollout. The executor loads the state into
        # this object only when the layout runs the policy in this process; with replicas
        # elsewhere (two actors, policy workers) it kept the statistics of wrap time, and the
        # buffer got observations normalised otherwise than the policy had seen them.
        self.adapter.load_obs_stats(state)
        if self.tuner is not None:
            # What is left of learn(): the online tuner moves only where the move pays back within it.
            left = int(getattr(model, "_total_timesteps", 0) or 0) - int(model.num_timesteps)
            per = num_steps * self.executor.num_envs
            rollout = self.tuner.collect(num_steps, remaining_collects=max(0, -(-left // per) - 1) if left > 0 else None)
        else:
            rollout = self.executor.collect(num_steps)
        self.collects += 1
        self.last_stats = rollout.stats
        self._log(model, rollout)
        if self.snapshot is not None:
            if self.tuner is None:
                self.snapshot.update(throughput_now=rollout.stats.steps_per_second,
                                     current_config=self.executor.config.to_dict())
            else:
                self.snapshot.update(throughput_now=rollout.stats.steps_per_second)
        return rollout

    def _log(self, model: Any, rollout: Any) -> None:
        log = model.logger
        st = rollout.stats
        log.record("auturi/steps_per_second", float(st.steps_per_second))
        log.record("auturi/collect_seconds", float(st.seconds))
        log.record("auturi/config", str(self.executor.config), exclude=("tensorboard",))
        log.record("auturi/reconfigure_seconds", float(self.executor.last_reconfigure_seconds))
        t = self.tuner
        if t is None:
            return
        log.record("auturi/tuner_phase", t.phase, exclude=("tensorboard",))
        log.record("auturi/tuner_trials", len(t.history))
        best = t.best()
        if best is not None:
            log.record("auturi/best_steps_per_second", float(best.estimate))
        if t.locked is not None:
            res = t.result()
            log.record("auturi/choice", str(res.choice), exclude=("tensorboard",))
            for versus in ("start", "serial"):
                gain = res.speedup(versus)
                if np.isfinite(gain):
                    log.record(f"auturi/speedup_vs_{versus}", float(gain))
            if not self._locked_logged and model.verbose >= 1:
                print(f"auturi: locked in {res.choice} ({res.reason})")
            self._locked_logged = True

    def close(self) -> None:
        """End the workers (and the status server). Idempotent."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        self.executor.close()


# ============================================================================ collection
def _collect_rollouts(self: Any, env: Any, callback: Any, rollout_buffer: Any, n_rollout_steps: int) -> bool:
    """SB3's ``OnPolicyAlgorithm.collect_rollouts`` over an Auturi executor (see the module doc)."""
    import torch as th
    from gymnasium import spaces
    from stable_baselines3.common.utils import obs_as_tensor

    h: SB3Handle = self.auturi
    if env is not h.source_env:
        raise AuturiError("the model's env changed after auturi.wrap (model.set_env?); the executor still runs the "
                          "old envs. Call auturi.adapters.sb3.unwrap_sb3(model), then auturi.wrap(model) again")
    self.policy.set_training_mode(False)
    n_steps = 0
    rollout_buffer.reset()
    callback.on_rollout_start()

    rollout = h.collect(self, n_rollout_steps)
    T, N = rollout.num_steps, rollout.num_envs
    adapter, vn = h.adapter, h.vecnorm
    # Observations as the policy saw them (VecNormalize: the statistics of the rollout's start).
    obs_seen = adapter.normalize_obs(rollout.observations) if vn is not None else rollout.observations
    extras = rollout.extras
    is_box = isinstance(self.action_space, spaces.Box)
    actions_all = extras["raw_actions"] if is_box else rollout.actions
    values_all, log_probs_all = extras["values"], extras["log_probs"]
    rewards_all = rollout.rewards.astype(np.float32)
    dones_all = rollout.terminated | rollout.truncated
    terminal_obs = {k: (adapter.normalize_obs(np.asarray(v)[None])[0] if vn is not None else v)
                    for k, v in rollout.final_observations.items()}
    cpu = self.device.type == "cpu"

    _restart_cut_episodes(self, h, rollout.episode_starts[0], rollout.observations[0])
    self._last_obs = obs_seen[0]
    self._last_episode_starts = rollout.episode_starts[0]
    for t in range(T):
        if cpu:
            obs_tensor = obs_as_tensor(self._last_obs, self.device)
        actions = actions_all[t]
        values = th.as_tensor(values_all[t]).reshape(-1, 1)
        log_probs = th.as_tensor(log_probs_all[t])
        clipped_actions = rollout.actions[t]
        last_row = t == T - 1
        raw_new_obs = rollout.last_observations if last_row else rollout.observations[t + 1]
        dones = dones_all[t].copy()
        rewards = rewards_all[t].copy()
        if vn is not None:
            vn.old_obs = raw_new_obs
            vn.old_reward = rewards
            if vn.training and vn.norm_obs:
                vn.obs_rms.update(raw_new_obs)
            if vn.training:
                vn._update_reward(rewards)
            rewards = vn.normalize_reward(rewards)
            vn.returns[dones] = 0
        # The last row is normalised with the statistics updated through it, as SB3's is
        # (and as the next rollout's first row will be).
        new_obs = (vn.normalize_obs(raw_new_obs) if (vn is not None and last_row) else
                   rollout.last_observations if last_row else obs_seen[t + 1])
        infos: list[dict[str, Any]] = []
        for i in range(N):
            if dones[i]:
                info = dict(rollout.final_infos.get((t, i), {}))
                info["TimeLimit.truncated"] = bool(rollout.truncated[t, i] and not rollout.terminated[t, i])
                info["terminal_observation"] = terminal_obs[(t, i)]
            else:
                info = {"TimeLimit.truncated": False}
            infos.append(info)

        self.num_timesteps += N

        # Give access to local variables
        callback.update_locals(locals())
        if not callback.on_step():
            return False

        self._update_info_buffer(infos, dones)
        n_steps += 1

        if isinstance(self.action_space, spaces.Discrete):
            # Reshape in case of discrete action
            actions = actions.reshape(-1, 1)

        # Handle timeout by bootstrapping with value function (SB3 issue #633)
        for idx, done in enumerate(dones):
            if (
                done
                and infos[idx].get("terminal_observation") is not None
                and infos[idx].get("TimeLimit.truncated", False)
            ):
                terminal_obs_t = self.policy.obs_to_tensor(infos[idx]["terminal_observation"])[0]
                with th.no_grad():
                    terminal_value = self.policy.predict_values(terminal_obs_t)[0]
                rewards[idx] += self.gamma * terminal_value

        rollout_buffer.add(self._last_obs, actions, rewards, self._last_episode_starts, values, log_probs)
        self._last_obs = new_obs
        self._last_episode_starts = dones

    if vn is not None:
        self._last_original_obs = rollout.last_observations
    with th.no_grad():
        # Compute value for the last timestep
        values = self.policy.predict_values(obs_as_tensor(new_obs, self.device))

    rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)

    callback.update_locals(locals())

    callback.on_rollout_end()

    return True


def _restart_cut_episodes(model: Any, h: SB3Handle, starts: np.ndarray, raw_obs: np.ndarray) -> None:
    """Account for episodes the executor cut: a reconfigure that recreates envs starts each
    with a new episode (``starts`` True) although its last one had not ended (the previous
    rollout's last ``dones`` False). The learner has already bootstrapped the cut episode
    from V(its last observation) in that rollout's GAE, exactly as SB3 bootstraps any
    episode still running at a rollout's end, so its data needs nothing more. What does:
    VecNormalize, updated as ``VecNormalize.reset()`` updates it for a restarted env (the
    running discounted return restarts, which carried the old episode's return into the new
    one's reward statistics when missed; the reset observation enters the observation
    statistics), and the count of cut episodes (``auturi/cut_episodes``): they end in no
    Monitor record, so the episode statistics miss them (and lean to the shorter episodes)."""
    cut = np.asarray(starts, dtype=bool) & ~np.asarray(model._last_episode_starts, dtype=bool)
    h.cut_episodes += int(cut.sum())
    model.logger.record("auturi/cut_episodes", h.cut_episodes)
    vn = h.vecnorm
    if vn is not None and cut.any():
        vn.returns[cut] = 0
        if vn.training and vn.norm_obs:
            vn.obs_rms.update(raw_obs[cut])


# ================================================================================== wrap
_PATCHED = ("collect_rollouts", "auturi", "_excluded_save_params")


def _excluded_save_params(self: Any) -> list[str]:
    return [*type(self)._excluded_save_params(self), *_PATCHED]


def _resolve_seed(model: Any, seed: int | None, base_venv: Any) -> int:
    if seed is None:
        seed = getattr(model, "seed", None)
    if seed is None:
        seeds = getattr(base_venv, "_seeds", None)
        if seeds and isinstance(seeds[0], (int, np.integer)):
            seed = int(seeds[0])
    if seed is None:
        seed = int(np.random.randint(0, 2**31 - 1))
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be >= 0 for auturi (env i is seeded seed + i), got {seed}")
    return seed


def wrap_sb3(model: Any, *, config: Config | None = None, tune: bool = True, strategy: str = "model",
             budget: Any = None, backend: str = "shm", status_port: int | None = None,
             env_fn: Callable[[], gym.Env] | Sequence[Callable[[], gym.Env]] | None = None,
             seed: int | None = None, deterministic: bool = False, worker_timeout: float | None = None) -> Any:
    """Make ``model.learn()`` collect its experience through an Auturi executor.

    Returns the same ``model`` object. ``learn``, ``save``, ``load``, ``predict``, callbacks,
    the progress bar and the logger keep working; the rollout buffer gets what SB3's own loop
    would put there (see ``docs/adapters.md`` for the few differences).

    Args:
        model: a ``stable_baselines3`` ``PPO`` or ``A2C`` (any ``OnPolicyAlgorithm`` that keeps
            SB3's ``collect_rollouts`` and an ``ActorCriticPolicy``) with an env.
        config: a fixed :class:`~auturi.Config` (its total envs must be ``model.n_envs``); no
            tuning then.
        tune: without ``config``, tune the layout online with
            :class:`auturi.tuner.OnlineTuner` (each rollout is one measurement; nothing is
            wasted). ``False``: run ``Config.serial(n_envs)``.
        strategy: the tuner's search strategy (``"model"``, ``"grid"``, ``"optuna"``).
        budget: the tuner's budget: an int (configs to measure), a float (seconds) or a dict
            of :class:`~auturi.tuner.OnlineTuner` keyword arguments.
        backend: ``"shm"`` (processes and shared memory) or ``"serial"``.
        status_port: serve the status (tuner trials, throughput, config) over HTTP on this
            loopback port (``auturi.server``; 0 picks a free one, see ``model.auturi.server.url``).
        env_fn: a zero-argument callable returning one ``gymnasium.Env`` as the model's
            VecEnv builds each env (Monitor included, VecEnv wrappers excluded), or a list
            of ``n_envs`` of them. Needed when the envs cannot be rebuilt from the model.
        seed: env ``i`` is seeded ``seed + i`` and the action noise is keyed by it. Default:
            ``model.seed``, else the VecEnv's pending seeds, else a random one.
        deterministic: act with the mode of the action distribution (for tests/evaluation).
        worker_timeout: seconds a worker may go without progress (a stuck env step, a stopped
            process) before ``learn`` raises :class:`~auturi.WorkerError` naming it with its
            stack; ``None``: ``$AUTURI_WORKER_TIMEOUT``, else 60 s.

    Raises:
        NotImplementedError: off-policy algorithms, gSDE, unsupported VecEnv wrappers or
            action distributions.
        EnvRebuildError: the envs cannot be rebuilt in another process and no ``env_fn``.
    """
    try:
        from stable_baselines3.common.base_class import BaseAlgorithm
        from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
        from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
        from stable_baselines3.common.policies import ActorCriticPolicy
    except ImportError as exc:  # pragma: no cover - SB3 is what the caller passed
        raise ImportError("auturi.adapters.sb3 needs stable-baselines3: pip install stable-baselines3") from exc

    if isinstance(model, OffPolicyAlgorithm):
        raise NotImplementedError(
            f"auturi.wrap supports on-policy SB3 algorithms (PPO, A2C) for now; {type(model).__name__} is off-policy "
            f"(its replay-buffer loop interleaves env steps and gradient steps)")
    if not isinstance(model, OnPolicyAlgorithm):
        what = "an SB3 algorithm" if isinstance(model, BaseAlgorithm) else "not an SB3 algorithm"
        raise TypeError(f"auturi.wrap(model) expects a stable_baselines3 PPO or A2C model; got "
                        f"{type(model).__name__} ({what})")
    if "auturi" in vars(model):
        raise AuturiError("this model is already wrapped by auturi; call auturi.adapters.sb3.unwrap_sb3(model) first")
    if type(model).collect_rollouts is not OnPolicyAlgorithm.collect_rollouts:
        raise NotImplementedError(f"{type(model).__name__} overrides collect_rollouts (e.g. recurrent or masked "
                                  f"policies); auturi.wrap supports algorithms that use SB3's own loop (PPO, A2C)")
    if model.use_sde:
        raise NotImplementedError("gSDE (use_sde=True) is not supported by auturi.wrap yet: its exploration noise is "
                                  "a per-env matrix resampled every sde_sample_freq steps. Train with use_sde=False")
    if not isinstance(model.policy, ActorCriticPolicy):
        raise NotImplementedError(f"auturi.wrap needs an ActorCriticPolicy, got {type(model.policy).__name__}")
    if type(model.policy).forward is not ActorCriticPolicy.forward:
        raise NotImplementedError(f"{type(model.policy).__name__} overrides forward(); auturi.wrap re-implements "
                                  f"ActorCriticPolicy.forward to sample from its own noise, so it would not run it")
    if isinstance(model.observation_space, gym.spaces.Dict):
        raise NotImplementedError("Dict observation spaces are not supported by auturi.wrap yet")
    if model.env is None:
        raise AuturiError("the model has no env (loaded without env=?); call model.set_env(env) first")
    dist = type(model.policy.action_dist).__name__
    if dist not in _DISTRIBUTIONS:
        raise NotImplementedError(f"auturi.wrap supports the action distributions {sorted(_DISTRIBUTIONS)}; this "
                                  f"policy uses {dist}")
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be an auturi.Config, got {type(config).__name__}")
    check_face_options(backend, worker_timeout)
    n = int(model.n_envs)
    if config is not None and config.num_envs != n:
        from auturi.errors import ConfigError

        raise ConfigError("num_actors*envs_per_actor", config.num_envs, f"must equal the model's n_envs={n}")

    # --- envs
    base_venv, vec_layers, vecnorm = _split_vec_wrappers(model.env)
    if env_fn is not None:
        fns = list(env_fn) if isinstance(env_fn, Sequence) else [env_fn] * n
        if len(fns) != n or not all(callable(f) for f in fns):
            raise TypeError(f"env_fn must be a zero-argument callable returning a gymnasium.Env, or a list of "
                            f"n_envs={n} of them")
        factories = [EnvFactory(("fn", f), name=getattr(f, "__name__", "env_fn")) for f in fns]
    else:
        factories = _factories_from_vecenv(base_venv)
    factories = [f.with_layers(vec_layers) for f in factories]
    raw_space = (vecnorm.venv if vecnorm is not None else model.env).observation_space
    probe = factories[0]()
    try:
        if not isinstance(probe, gym.Env):
            raise TypeError(f"the env factory returned {type(probe).__name__}, not a gymnasium.Env")
        if not _same_space(probe.observation_space, raw_space) or not _same_space(probe.action_space,
                                                                                   model.action_space):
            raise EnvRebuildError(
                f"the rebuilt env does not match the model: observation space {probe.observation_space} vs "
                f"{raw_space}, action space {probe.action_space} vs {model.action_space}. "
                + ("Check env_fn: it must return the env as the VecEnv holds it, without VecEnv wrappers"
                   if env_fn is not None else _ENV_FN_HINT))
    finally:
        probe.close()

    # --- policy
    normalize = None
    if vecnorm is not None and vecnorm.norm_obs:
        normalize = {"epsilon": float(vecnorm.epsilon), "clip_obs": float(vecnorm.clip_obs)}
    kwargs = dict(model.policy_kwargs)
    kwargs["use_sde"] = False
    adapter = SB3PolicyAdapter(model.policy_class, model.observation_space, model.action_space, kwargs, dist,
                               learning_rate=float(model.lr_schedule(1)), deterministic=deterministic,
                               normalize=normalize)
    seed = _resolve_seed(model, seed, base_venv)
    adapter.load_state(_policy_state(model, vecnorm))

    # --- executor and tuner
    from auturi.executor import make_executor

    from auturi.tuner import OnlineTuner

    tuner_cls = OnlineTuner if (tune and config is None) else None
    start = config or Config.serial(n)
    executor = make_executor(factories, adapter, num_envs=n, config=start, backend=backend, seed=seed,
                             worker_timeout=worker_timeout)
    tuner = None
    snapshot = server = None
    try:
        tkw = tuner_kwargs(budget)
        if status_port is not None:
            snapshot = _status_snapshot()
            if tuner_cls is not None:
                user_cb = tkw.pop("callback", None)
                tkw["callback"] = snapshot if user_cb is None else _both(snapshot, user_cb)
        if tuner_cls is not None:
            tuner = tuner_cls(executor, strategy=strategy, seed=seed,
                              workload={"sb3": type(model).__name__, "env": factories[0].name}, **tkw)
        if snapshot is not None:
            if tuner is not None:
                snapshot.attach(tuner)
                snapshot.refresh()
            else:
                snapshot.update(status={"phase": "locked", "mode": "fixed", "current_config": start.to_dict(),
                                        "trials": 0})
            from auturi.server import StatusServer

            server = StatusServer(snapshot, port=int(status_port))
            url = server.start()
            if model.verbose >= 1:
                print(f"auturi: status at {url}")
    except BaseException:
        if server is not None:
            server.stop()
        executor.close()
        raise

    handle = SB3Handle(model, executor, adapter, vecnorm, model.env, tuner, seed, raw_space)
    handle.snapshot, handle.server = snapshot, server
    model.auturi = handle
    model.collect_rollouts = types.MethodType(_collect_rollouts, model)
    model._excluded_save_params = types.MethodType(_excluded_save_params, model)
    return model


def _status_snapshot() -> Any:
    try:
        from auturi.server import StatusSnapshot
    except ImportError as exc:
        raise ImportError(f"status_port needs the status endpoint's dependencies ({exc}): "
                          f"pip install 'auturi[server]', or omit status_port") from exc
    return StatusSnapshot()


def _both(first: Callable[[Any], None], second: Callable[[Any], None]) -> Callable[[Any], None]:
    def call(event: Any) -> None:
        first(event)
        second(event)

    return call


def unwrap_sb3(model: Any) -> Any:
    """Close the executor and give ``model`` back its own ``collect_rollouts``. Returns it."""
    h = vars(model).get("auturi")
    if h is not None:
        h.close()
    for name in _PATCHED:
        vars(model).pop(name, None)
    return model
