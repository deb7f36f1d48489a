"""What the buffers must hold, found once by probing one env and the policy; and the check that
what an env returns fits gymnasium's API and those buffers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from auturi.errors import EnvCheckError
from auturi.policy import Policy


@dataclass(frozen=True)
class ArraySpec:
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class WorkloadSpec:
    """Shapes and dtypes of everything a rollout holds."""

    observation_space: gym.Space
    action_space: gym.Space
    obs: ArraySpec
    action: ArraySpec
    extras: dict[str, ArraySpec]
    noise_dim: int

    def rollout_specs(self, num_steps: int, num_envs: int) -> list[tuple[str, tuple[int, ...], str]]:
        """Arrays of the rollout block. ``obs`` and ``starts`` have one more row: the last
        observation, which the next collect starts from."""
        T, N = num_steps, num_envs
        specs = [
            ("obs", (T + 1, N, *self.obs.shape), self.obs.dtype),
            ("starts", (T + 1, N), "bool"),
            ("actions", (T, N, *self.action.shape), self.action.dtype),
            ("rewards", (T, N), "float64"),
            ("terminated", (T, N), "bool"),
            ("truncated", (T, N), "bool"),
            ("noise", (T, N, self.noise_dim), "float32"),
        ]
        specs += [(f"extras.{k}", (T, N, *v.shape), v.dtype) for k, v in self.extras.items()]
        return specs


def obs_array_spec(space: gym.Space) -> ArraySpec:
    if isinstance(space, gym.spaces.Box):
        return ArraySpec(tuple(space.shape), np.dtype(space.dtype).str)
    if isinstance(space, gym.spaces.Discrete):
        return ArraySpec((), np.dtype(np.int64).str)
    if isinstance(space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        return ArraySpec(tuple(space.shape), np.dtype(space.dtype).str)
    raise TypeError(
        f"observation space {space} is not supported yet (Box, Discrete, MultiDiscrete, MultiBinary are); "
        f"for Dict or Tuple spaces wrap the env in gymnasium.wrappers.FlattenObservation"
    )


def probe_spec(observation_space: gym.Space, action_space: gym.Space, policy: Policy,
               sample_obs: np.ndarray) -> WorkloadSpec:
    """Run the policy once on one observation to learn its output shapes."""
    obs = obs_array_spec(observation_space)
    noise_dim = int(getattr(policy, "noise_dim", 0))
    batch = np.asarray(sample_obs, dtype=np.dtype(obs.dtype))[None]
    actions, extras = policy.act(batch, np.full((1, noise_dim), 0.5, np.float32))
    actions = np.asarray(actions)
    if actions.shape[:1] != (1,):
        raise TypeError(f"policy.act returned actions of shape {actions.shape} for a batch of 1; "
                        f"the first axis must be the batch")
    ex = {}
    for k, v in (extras or {}).items():
        v = np.asarray(v)
        if v.shape[:1] != (1,):
            raise TypeError(f"policy extra {k!r} has shape {v.shape} for a batch of 1; the first axis must be the batch")
        ex[k] = ArraySpec(tuple(v.shape[1:]), v.dtype.str)
    return WorkloadSpec(observation_space, action_space, obs, ArraySpec(tuple(actions.shape[1:]), actions.dtype.str),
                        ex, noise_dim)


# ---------------------------------------------------------------------------- env output checks
# What an env returns is checked against gymnasium's API and its declared spaces on its first
# reset and first step only (see EnvRunner): a check on every step would cost more than a cheap
# env's step, and an env that is right once is almost always right after.

OLD_API_FIX = (
    "This is the gym<0.26 API (step -> (obs, reward, done, info), reset -> obs); auturi, like SB3 and "
    "gymnasium 1.x, needs reset -> (obs, info) and step -> (obs, reward, terminated, truncated, info). "
    "Adapt the env with shimmy (gymnasium 1.x has no apply_api_compatibility): pip install \"shimmy[gym-v21]\", "
    "then env=lambda: gymnasium.make(\"GymV21Environment-v0\", env=YourEnv()); or change its reset and step "
    "(gymnasium.utils.step_api_compatibility.convert_to_terminated_truncated_step_api converts one step's result).")


def _describe(x: Any) -> str:
    if isinstance(x, tuple):
        return f"a tuple of {len(x)} ({', '.join(type(v).__name__ for v in x)})"
    if isinstance(x, np.ndarray):
        return f"an array of shape {x.shape} and dtype {x.dtype}"
    return f"a {type(x).__name__}"


def check_reset_output(out: Any, index: int, env: Any, row: np.ndarray) -> str | None:
    """Check one ``env.reset()`` result; returns a warning text, or None. ``row`` is the
    rollout row the observation is stored in (its shape and dtype)."""
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise EnvCheckError(f"env {index}: reset() returned {_describe(out)}, not (obs, info) with info a dict. "
                            + OLD_API_FIX)
    return check_observation(out[0], index, env, row, "reset()")


def probe_reset(env: Any, seed: int) -> Any:
    """``env.reset(seed=seed)``'s observation, the result checked as an EnvRunner checks an
    env's first reset (the executor's probe: a copy of env 0, so errors name env 0)."""
    out = env.reset(seed=seed)
    spec = obs_array_spec(env.observation_space)
    check_reset_output(out, 0, env, np.empty(spec.shape, spec.dtype))
    return out[0]


def check_step_output(out: Any, index: int, env: Any, row: np.ndarray) -> str | None:
    """Check one ``env.step()`` result as :func:`check_reset_output` does a reset's."""
    if not (isinstance(out, tuple) and len(out) == 5):
        fix = OLD_API_FIX if isinstance(out, tuple) and len(out) == 4 else (
            "gymnasium's step returns (obs, reward, terminated, truncated, info).")
        raise EnvCheckError(f"env {index}: step() returned {_describe(out)}. {fix}")
    _, reward, terminated, truncated, info = out
    bad = []
    if np.ndim(reward) != 0 or not np.isrealobj(reward) or isinstance(reward, (str, bytes)):
        bad.append(f"reward {reward!r} is not a real scalar")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if np.ndim(flag) != 0 or isinstance(flag, (str, bytes)):
            bad.append(f"{name} {flag!r} is not a scalar bool")
    if not isinstance(info, dict):
        bad.append(f"info is {_describe(info)}, not a dict")
    if bad:
        raise EnvCheckError(f"env {index}: step() returned (obs, reward, terminated, truncated, info) with "
                            f"{'; '.join(bad)}. Return Python or numpy scalars and a dict, as gymnasium's API says.")
    return check_observation(out[0], index, env, row, "step()")


def check_observation(obs: Any, index: int, env: Any, row: np.ndarray, where: str) -> str | None:
    """Raise if ``obs`` cannot be stored in ``row`` as it is (not numeric, another shape:
    numpy would broadcast some wrong shapes silently); return a warning text if some values
    change when stored (out of the row dtype's range), else None."""
    space = getattr(env, "observation_space", None)
    arr = np.asarray(obs)
    if arr.dtype.kind not in "biuf":
        raise EnvCheckError(f"env {index}: {where} returned an observation that is {_describe(obs)} "
                            f"(numpy dtype {arr.dtype}), not numeric; the observation space is {space}.")
    if arr.shape != row.shape:
        raise EnvCheckError(f"env {index}: {where} returned an observation of shape {arr.shape} (dtype {arr.dtype}) "
                            f"for the observation space {space}, whose observations have shape {row.shape}. "
                            f"Return observations of the declared shape, or declare the shape the env returns.")
    bad = _unrepresentable(arr, row.dtype)
    if bad is None or not bad.any():
        return None
    where_bad = tuple(int(j) for j in np.argwhere(bad)[0])
    with np.errstate(all="ignore"):
        stored = arr[where_bad].astype(row.dtype)
    return (f"env {index}: {where} returned {int(bad.sum())} observation value(s) that {row.dtype} cannot hold "
            f"(e.g. {arr[where_bad]!r} at {where_bad}, stored as {stored!r}); the observation space is {space}. "
            f"Declare a dtype that holds them, or scale or clip them in the env. "
            f"(Checked on each env's first reset and step; reported once per env.)")


def _unrepresentable(arr: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """Where a cast of ``arr`` to ``dtype`` changes a value's magnitude (overflow to inf, or
    out of an integer range); None when no value can be lost that way."""
    if arr.dtype == dtype or dtype.kind == "b":
        return None
    if dtype.kind == "f":
        if arr.dtype.kind != "f" or arr.dtype.itemsize <= dtype.itemsize:
            return None  # every integer up to 64 bits is within float32's range
        with np.errstate(over="ignore"):
            return np.isfinite(arr) & ~np.isfinite(arr.astype(dtype))
    info = np.iinfo(dtype)
    if arr.dtype.kind == "f":
        return ~np.isfinite(arr) | (arr < info.min) | (arr > info.max)
    if arr.dtype.kind in "iu":
        return (arr < info.min) | (arr > info.max)
    return None
