"""PufferLib's vector envs as benchmark peers (imports pufferlib; only :mod:`bench.peers`
loads it, and only when a ``pufferlib*`` peer runs).

Tested with ``pufferlib-core`` 3.0.23 (the wheel of PufferLib's vectorisation, emulation and
models), installed with ``pip install --no-deps pufferlib-core==3.0.23``: it pins
``torch==2.9.0``, which would replace the project's torch, and its vector envs never touch
torch. The full ``pufferlib`` 3.0.0 is an sdist whose build downloads raylib, so it does not
install on a machine without access beyond the package registry.

Settings, as PufferLib's docs recommend them, on ``C`` usable cores and ``N`` envs
(``W = min(C, N)`` worker processes of ``N / W`` envs each, :func:`bench.torchrl_peer.layout`):

===============  ===========================================================================
kind             what runs
===============  ===========================================================================
pufferlib        ``pufferlib.vector.Multiprocessing``, ``num_workers=W``, ``batch_size=N``
                 (synchronous: every env steps once per policy call)
pufferlib_async  the same with ``batch_size = N / 2`` (PufferLib's ``"auto"``): the policy
                 acts on the first half of the envs to finish, like EnvPool's async mode
===============  ===========================================================================

Each env is the workload's gymnasium env in ``pufferlib.emulation.GymnasiumPufferEnv``; the
policy is the workload's, called as :class:`bench.peers.PeerRunner` calls it. PufferLib's
workers poll shared memory for work (they spin while idle), as the library is designed to.
"""
from __future__ import annotations

import functools
import importlib.util
import time
from typing import Any, Callable

import numpy as np

from bench.common import act

KINDS = ("pufferlib", "pufferlib_async")


def unavailable() -> str | None:
    """Why the PufferLib peers cannot run here, or None."""
    if importlib.util.find_spec("pufferlib") is None:
        return ("pufferlib is not installed (pip install --no-deps pufferlib-core==3.0.23: it pins torch 2.9.0, "
                "which --no-deps keeps out)")
    return None


class PufferLibRunner:
    """One of :data:`KINDS` (see the module doc); ``run`` and ``close`` as
    :class:`bench.peers.PeerRunner`'s."""

    def __init__(self, kind: str, env_fn: Callable[[], Any], num_envs: int, policy: Any, seed: int = 0,
                 warmup_steps: int = 0, cores: int | None = None):
        import pufferlib.emulation
        import pufferlib.vector as pv

        from bench.torchrl_peer import layout

        if kind not in KINDS:
            raise ValueError(f"unknown PufferLib peer {kind!r}; choose one of {KINDS}")
        self.kind, self.n, self.policy = kind, num_envs, policy
        workers, per = layout(num_envs, cores)
        # batch_size must be a multiple of the envs per worker: half the envs, rounded to one
        self.batch = num_envs if kind == "pufferlib" else max(per, num_envs // 2 // per * per)
        make = functools.partial(pufferlib.emulation.GymnasiumPufferEnv, env_creator=env_fn)
        self.env = pv.make(make, backend=pv.Multiprocessing, num_envs=num_envs, num_workers=workers,
                           batch_size=self.batch, seed=seed)
        self.settings: dict[str, Any] = {"num_envs": num_envs, "backend": "Multiprocessing",
                                         "num_workers": workers, "batch_size": self.batch}
        space = self.env.single_action_space
        # PufferLib checks the first actions against the space; a Gaussian's samples are clipped
        # into the bounds, as the gymnasium envs here would clip them
        self._bounds = (space.low, space.high) if hasattr(space, "low") else None
        self.env.async_reset(seed)
        self.rng = np.random.default_rng(seed)
        if warmup_steps:
            self.run(warmup_steps)

    def _clip(self, actions: np.ndarray) -> np.ndarray:
        if self._bounds is None:
            return actions
        return np.clip(actions, *self._bounds).astype(self._bounds[0].dtype, copy=False)

    def run(self, num_steps: int) -> float:
        """``num_steps * num_envs // batch`` policy calls on the batches as they arrive; env
        steps per second."""
        calls = max(1, num_steps * self.n // self.batch)
        t0 = time.perf_counter()
        for _ in range(calls):
            obs = self.env.recv()[0]
            self.env.send(self._clip(act(self.policy, obs, self.rng)))
        return calls * self.batch / (time.perf_counter() - t0)

    def close(self) -> None:
        procs = list(getattr(self.env, "processes", []))
        self.env.close()  # terminates the workers without waiting for them
        for p in procs:
            p.join(timeout=10)
