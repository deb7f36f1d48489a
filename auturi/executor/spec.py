"""What the buffers must hold, found once by probing one env and the policy."""
from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

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
