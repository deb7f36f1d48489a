"""The peers a user would pick instead of Auturi, each running the same collection loop
(policy on the current observations, then a vectorised env step) with the same policy:
SB3 DummyVecEnv and SubprocVecEnv, gymnasium AsyncVectorEnv.

Example:
    >>> from bench.peers import PeerRunner
    >>> from auturi import ConstantPolicy
    >>> import gymnasium as gym
    >>> p = PeerRunner("dummy", lambda: gym.make("CartPole-v1"), 2, ConstantPolicy(gym.spaces.Discrete(2)))
    >>> p.run(10) > 0
    True
    >>> p.close()
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

PEERS = ("dummy", "subproc", "async")


class PeerRunner:
    """``kind`` is ``dummy``/``subproc`` (SB3) or ``async`` (gymnasium, shared memory)."""

    def __init__(self, kind: str, env_fn: Callable[[], Any], num_envs: int, policy: Any, seed: int = 0):
        self.kind, self.n, self.policy = kind, num_envs, policy
        if kind == "dummy":
            from stable_baselines3.common.vec_env import DummyVecEnv

            self.env = DummyVecEnv([env_fn] * num_envs)
        elif kind == "subproc":
            from stable_baselines3.common.vec_env import SubprocVecEnv

            self.env = SubprocVecEnv([env_fn] * num_envs, start_method="forkserver")
        elif kind == "async":
            import gymnasium as gym

            self.env = gym.vector.AsyncVectorEnv([env_fn] * num_envs, shared_memory=True)
        else:
            raise ValueError(f"unknown peer {kind!r}; choose one of {PEERS}")
        if kind == "async":
            self.obs, _ = self.env.reset(seed=seed)
        else:
            self.env.seed(seed)
            self.obs = self.env.reset()
        self.rng = np.random.default_rng(seed)

    def run(self, num_steps: int) -> float:
        """Collect ``num_steps`` rows; return env steps per second."""
        k = getattr(self.policy, "noise_dim", 0)
        t0 = time.perf_counter()
        for _ in range(num_steps):
            noise = self.rng.random((self.n, k), dtype=np.float32)
            actions, _ = self.policy.act(np.asarray(self.obs), noise)
            if self.kind == "async":
                self.obs, *_ = self.env.step(actions)
            else:
                self.obs, *_ = self.env.step(actions)
        return num_steps * self.n / (time.perf_counter() - t0)

    def close(self) -> None:
        self.env.close()
