"""One policy replica's work (:class:`PolicyRunner`): gather observations and noise from the
rollout arrays, run the policy, scatter actions and extras back in place."""
from __future__ import annotations

import time

import numpy as np

from auturi.policy import Policy


class PolicyRunner:
    def __init__(self, policy: Policy):
        self.policy = policy
        self.policy_seconds = 0.0
        self.weights_version = -1
        self.a: dict[str, np.ndarray] = {}
        self._extras: list[str] = []

    def bind(self, arrays: dict[str, np.ndarray]) -> None:
        self.a = arrays
        self._extras = [k[len("extras."):] for k in arrays if k.startswith("extras.")]

    def load(self, state, version: int) -> None:
        self.policy.load_state(state)
        self.weights_version = version

    def act(self, ts: np.ndarray, ids: np.ndarray) -> None:
        """Act for the envs ``ids`` at rows ``ts`` (fancy indexing: a gather and a scatter)."""
        a = self.a
        t0 = time.perf_counter()
        actions, extras = self.policy.act(a["obs"][ts, ids], a["noise"][ts, ids])
        a["actions"][ts, ids] = actions
        for k in self._extras:
            a["extras." + k][ts, ids] = extras[k]
        self.policy_seconds += time.perf_counter() - t0

    def act_slice(self, t: int, lo: int, hi: int) -> None:
        """Act for envs ``lo..hi-1`` at row ``t`` (the serial loop: contiguous, no gather)."""
        a = self.a
        t0 = time.perf_counter()
        actions, extras = self.policy.act(a["obs"][t, lo:hi], a["noise"][t, lo:hi])
        a["actions"][t, lo:hi] = actions
        for k in self._extras:
            a["extras." + k][t, lo:hi] = extras[k]
        self.policy_seconds += time.perf_counter() - t0
