"""What a collect returns: :class:`Rollout` (time-major arrays) and :class:`CollectStats`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class CollectStats:
    """Timing of one collect. ``env_seconds``, ``policy_seconds`` and ``wait_seconds`` are
    summed over actors (so with several actors they can exceed ``seconds``). Each
    :class:`Rollout` carries its own as ``rollout.stats``.

    >>> from auturi import CollectStats
    >>> s = CollectStats(steps=1024, seconds=0.5, env_seconds=0.3, policy_seconds=0.15)
    >>> s.steps_per_second
    2048.0
    >>> round(s.seconds - s.env_seconds - s.policy_seconds, 2)   # neither stepping nor inference
    0.05
    """

    steps: int
    """Env steps taken (``num_steps * num_envs``)."""
    seconds: float
    """Wall seconds of the collect, as the caller saw it."""
    env_seconds: float = 0.0
    """Time spent stepping envs (in-process, or reported by env workers)."""
    policy_seconds: float = 0.0
    """Time spent in inference (in-process, or reported by replicas)."""
    wait_seconds: float = 0.0
    """Time actors spent blocked waiting for a worker to finish."""

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else float("inf")

    def to_dict(self) -> dict[str, float]:
        return {
            "steps": self.steps, "seconds": self.seconds, "steps_per_second": self.steps_per_second,
            "env_seconds": self.env_seconds, "policy_seconds": self.policy_seconds,
            "wait_seconds": self.wait_seconds,
        }


@dataclass
class Rollout:
    """Transitions of one collect, time-major: arrays are ``(num_steps, num_envs, ...)``
    with columns in global env order, whatever the config.

    Row ``t`` holds the observation the policy saw, the action it chose and what the env
    returned for it. When an episode ends at ``(t, i)`` the observation at ``t + 1`` is
    the reset one and ``episode_starts[t + 1, i]`` is True; the real last observation is
    in ``final_observations[(t, i)]`` and the env's info in ``final_infos[(t, i)]``.
    ``last_observations`` / ``last_episode_starts`` are the row after the last one, for
    bootstrapping the final value; the next collect starts from them.

    >>> import auturi, gymnasium as gym
    >>> from auturi.envs import CountingEnv   # episodes of 3 to 12 steps
    >>> policy = auturi.RandomPolicy(gym.spaces.Discrete(3))
    >>> with auturi.make_executor(CountingEnv, policy, num_envs=2, backend="serial") as ex:
    ...     r = ex.collect(16)
    >>> r.num_steps, r.num_envs, r.observations.shape, r.stats.steps
    (16, 2, (16, 2, 4), 32)
    >>> bool((r.episode_starts[1:] == r.dones[:-1]).all())   # an episode starts after each done
    True
    >>> len(r.final_observations) == int(r.dones.sum())     # each done keeps its real last obs
    True
    """

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode_starts: np.ndarray
    last_observations: np.ndarray
    last_episode_starts: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    final_observations: dict[tuple[int, int], Any] = field(default_factory=dict)
    final_infos: dict[tuple[int, int], dict] = field(default_factory=dict)
    stats: CollectStats | None = None

    @property
    def num_steps(self) -> int:
        return self.rewards.shape[0]

    @property
    def num_envs(self) -> int:
        return self.rewards.shape[1]

    @property
    def dones(self) -> np.ndarray:
        """``terminated | truncated``, as SB3's VecEnv reports it."""
        return self.terminated | self.truncated

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array by name (extras prefixed ``extras.``), for comparisons and saving."""
        out = {
            "observations": self.observations, "actions": self.actions, "rewards": self.rewards,
            "terminated": self.terminated, "truncated": self.truncated,
            "episode_starts": self.episode_starts, "last_observations": self.last_observations,
            "last_episode_starts": self.last_episode_starts,
        }
        out.update({f"extras.{k}": v for k, v in self.extras.items()})
        return out
