"""What the buffers must hold, found once by probing one env and the policy; and the check that
what an env returns fits gymnasium's API and those buffers."""
from __future__ import annotations

import math
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
# What an env returns is checked against gymnasium's API and the rollout arrays on every reset
# and step (EnvRunner's stand-in for each env compares each result's signature, its parts'
# types and the observation's shape and dtype, with the last one these functions accepted, and
# calls them when it differs, so they may be thorough). The rules:
# - observation: numeric (bool, int, uint, float: None, strings and objects would be stored as
#   NaN, parsed or refused by numpy depending on the copy path), of exactly the row's shape (a
#   (1,) array would be broadcast into every slot of a (4,) row); another numeric dtype is cast
#   as numpy casts, with a warning once per env when values change magnitude (first reset and
#   first step, and an env's first call that does not return the row's dtype).
# - reward: a real scalar: int, float, bool or a numpy number or 0-d array of those kinds,
#   which gymnasium's checker accepts too (it warns for bool; True is stored as 1.0, exactly).
#   Strings ("1.5" would be parsed), None (stored as NaN by one copy path, refused by another),
#   complex numbers and arrays of one or more elements are errors.
# - terminated, truncated: bool or numpy bool (gymnasium's checker expects these), or an
#   integer 0 or 1 (stored as the same bool); None, floats, strings, arrays are errors.
# - info: a dict (gymnasium's checker asserts it).
# - non-finite observations (after the cast to the row's dtype) and rewards: errors only with
#   ``check_finite`` (off by default, as gymnasium's checker only warns).

REAL_TYPES = frozenset({float, int, np.float64, np.float32, np.int64, np.int32})
"""Reward types that need no further look."""
BOOL_TYPES = frozenset({bool, np.bool_})
"""Episode-flag types that need no further look."""

OLD_API_FIX = (
    "This is the gym<0.26 API (step -> (obs, reward, done, info), reset -> obs); auturi, like SB3 and "
    "gymnasium 1.x, needs reset -> (obs, info) and step -> (obs, reward, terminated, truncated, info). "
    "Adapt the env with shimmy (gymnasium 1.x has no apply_api_compatibility): pip install \"shimmy[gym-v21]\", "
    "then env=lambda: gymnasium.make(\"GymV21Environment-v0\", env=YourEnv()); or change its reset and step "
    "(gymnasium.utils.step_api_compatibility.convert_to_terminated_truncated_step_api converts one step's result).")

FINITE_FIX = ("check_finite is on, so NaN and inf are errors: find where the env computes them (a division by "
              "zero, a simulation that blew up, an unset value) or clip them; make_executor(..., "
              "check_finite=False) (the default) stores them as they are.")


def _describe(x: Any) -> str:
    if isinstance(x, tuple):
        return f"a tuple of {len(x)} ({', '.join(type(v).__name__ for v in x)})"
    if isinstance(x, np.ndarray):
        return f"an array of shape {x.shape} and dtype {x.dtype}"
    return f"a {type(x).__name__}"


def check_reset_output(out: Any, index: int, env: Any, shape: tuple[int, ...], dtype: np.dtype, *,
                       warn_range: bool = True, finite: bool = False) -> str | None:
    """Check one ``env.reset()`` result against gymnasium's API and the rollout row its
    observation is stored in (``shape``, ``dtype``); raises :class:`EnvCheckError`, returns a
    warning text (values ``dtype`` cannot hold, looked for when ``warn_range``) or None."""
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise EnvCheckError(f"env {index}: reset() returned {_describe(out)}, not (obs, info) with info a dict. "
                            + OLD_API_FIX)
    return check_observation(out[0], index, env, shape, dtype, "reset()", warn_range, finite)


def probe_reset(env: Any, seed: int) -> Any:
    """``env.reset(seed=seed)``'s observation, the result checked as an EnvRunner checks an
    env's first reset (the executor's probe: a copy of env 0, so errors name env 0)."""
    out = env.reset(seed=seed)
    spec = obs_array_spec(env.observation_space)
    check_reset_output(out, 0, env, spec.shape, np.dtype(spec.dtype))
    return out[0]


def check_step_output(out: Any, index: int, env: Any, shape: tuple[int, ...], dtype: np.dtype, *,
                      warn_range: bool = True, finite: bool = False) -> str | None:
    """Check one ``env.step()`` result as :func:`check_reset_output` does a reset's."""
    if not (isinstance(out, tuple) and len(out) == 5):
        fix = OLD_API_FIX if isinstance(out, tuple) and len(out) == 4 else (
            "gymnasium's step returns (obs, reward, terminated, truncated, info).")
        raise EnvCheckError(f"env {index}: step() returned {_describe(out)}. {fix}")
    _, reward, terminated, truncated, info = out
    bad = []
    if not is_real_scalar(reward):
        bad.append(f"reward {reward!r} ({type(reward).__name__}) is not a real scalar")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not is_flag(flag):
            bad.append(f"{name} {flag!r} ({type(flag).__name__}) is not a bool")
    if not isinstance(info, dict):
        bad.append(f"info is {_describe(info)}, not a dict")
    if bad:
        raise EnvCheckError(f"env {index}: step() returned (obs, reward, terminated, truncated, info) with "
                            f"{'; '.join(bad)}. Return a Python or numpy int or float as the reward (float(x) "
                            f"converts a numeric string, a 1-element array or a tensor), bools as the flags and "
                            f"a dict as info, as gymnasium's API says.")
    if finite and not _finite_number(reward):
        raise EnvCheckError(f"env {index}: step() returned the reward {reward!r}. {FINITE_FIX}")
    return check_observation(out[0], index, env, shape, dtype, "step()", warn_range, finite)


def is_real_scalar(x: Any) -> bool:
    """A reward the rollout stores as the number it is (see the rules above)."""
    if x.__class__ in REAL_TYPES:
        return True
    if x is None or isinstance(x, (str, bytes)):
        return False
    try:
        arr = np.asarray(x)
    except Exception:  # an object numpy cannot look at is no number
        return False
    return arr.ndim == 0 and arr.dtype.kind in "biuf"


def finite_values(obs: Any, reward: Any, dtype: np.dtype) -> bool:
    """Whether ``obs`` stored as ``dtype`` and ``reward`` are finite (the quick test of
    ``check_finite``; the thorough check says what is not)."""
    if dtype.kind == "f":
        arr = np.asarray(obs)
        if arr.dtype != dtype:
            with np.errstate(all="ignore"):
                arr = arr.astype(dtype)
        if not np.isfinite(arr).all():
            return False
    try:
        return math.isfinite(reward)
    except (TypeError, ValueError, OverflowError):  # not a plain number: the thorough check decides
        return _finite_number(reward)


def _finite_number(x: Any) -> bool:
    try:
        return bool(np.isfinite(x))
    except (TypeError, OverflowError):  # a Python int beyond float64: stored as inf
        return False


def is_flag(x: Any) -> bool:
    """An episode flag the rollout stores as the bool it means (see the rules above)."""
    if x.__class__ in BOOL_TYPES:
        return True
    return isinstance(x, (int, np.integer)) and x in (0, 1)


def check_observation(obs: Any, index: int, env: Any, shape: tuple[int, ...], dtype: np.dtype, where: str,
                      warn_range: bool = True, finite: bool = False) -> str | None:
    """Raise if ``obs`` cannot be stored in a row of ``shape`` and ``dtype`` as it is (not
    numeric, another shape: numpy would broadcast some wrong shapes silently; with ``finite``,
    NaN or inf once stored); return a warning text if ``warn_range`` and some values change
    when stored (out of the row dtype's range), else None."""
    space = getattr(env, "observation_space", None)
    arr = np.asarray(obs)
    if arr.dtype.kind not in "biuf":
        raise EnvCheckError(f"env {index}: {where} returned an observation that is {_describe(obs)} "
                            f"(numpy dtype {arr.dtype}), not numeric; the observation space is {space}. "
                            f"Return a numpy array of the declared shape {shape} and dtype {dtype}.")
    if arr.shape != shape:
        raise EnvCheckError(f"env {index}: {where} returned an observation of shape {arr.shape} (dtype {arr.dtype}) "
                            f"for the observation space {space}, whose observations have shape {shape}. "
                            f"Return observations of the declared shape, or declare the shape the env returns.")
    if finite and dtype.kind == "f":
        check_finite_observation(arr, index, where, dtype)
    if not warn_range:
        return None
    bad = _unrepresentable(arr, dtype)
    if bad is None or not bad.any():
        return None
    where_bad = tuple(int(j) for j in np.argwhere(bad)[0])
    with np.errstate(all="ignore"):
        stored = arr[where_bad].astype(dtype)
    return (f"env {index}: {where} returned {int(bad.sum())} observation value(s) that {dtype} cannot hold "
            f"(e.g. {arr[where_bad]!r} at {where_bad}, stored as {stored!r}); the observation space is {space}. "
            f"Declare a dtype that holds them, or scale or clip them in the env. "
            f"(Looked for on each env's first reset and step; reported once per env.)")


def check_finite_observation(arr: np.ndarray, index: int, where: str, dtype: np.dtype) -> None:
    """Raise if ``arr``, stored as ``dtype`` (a float dtype), holds NaN or inf."""
    with np.errstate(all="ignore"):
        stored = arr.astype(dtype, copy=False)
    ok = np.isfinite(stored)
    if ok.all():
        return
    first = tuple(int(j) for j in np.argwhere(~ok)[0])
    orig = arr[first]
    became = f", returned as {orig!r}, beyond {dtype}'s range" if arr.dtype != dtype and np.isfinite(orig) else ""
    raise EnvCheckError(f"env {index}: {where} returned an observation with {int((~ok).sum())} non-finite "
                        f"value(s) (e.g. {stored[first]!r} at {first}{became}). {FINITE_FIX}")


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
