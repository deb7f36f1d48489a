"""One policy replica's work (:class:`PolicyRunner`): gather observations and noise from the
rollout arrays, run the policy, scatter actions and extras back in place.

The thread rule (in-process inference runs with the torch thread count found best for it):
the first time a runner acts, it times ``policy.act`` on that batch at 1 torch thread and at
the count the process has (torch's default, the number of cores, in the caller; the ``shm``
backend's share of free cores in a worker), a few calls each, alternated, and keeps the
faster: more threads only when at least :data:`MORE_THREADS_GAIN` (25%) faster, since on a
shared machine each extra thread takes a core from an env and waits for it. Every ``act``
then runs at that count and restores the previous count after, the way an actor's CPU
pinning is undone after a collect: the learner in the same process keeps its own setting.
A policy without torch (``needs_torch = False``, or torch never imported) skips all of this.
Measured on 2 cores, a 64x64 MLP at torch's default 2 threads took 2.3-25x as long per call
as at 1 thread, which made the serial baseline, and every "x serial" figure, wrong.
"""
from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from auturi.executor.buffers import MappedWeights
from auturi.policy import Policy
from auturi.resources import usable_cores

MORE_THREADS_GAIN = 0.25
"""More than one torch thread is kept only when its calls are this much faster: when other
processes want the cores, a multi-threaded call waits for its slowest thread (measured on 2
busy cores: 10-25x slower than 1 thread), so a small gain is not worth that risk."""
CALIBRATION_CALLS = 5
"""Timed calls per thread count (after one untimed call each), alternated between counts;
their median is compared (not the fastest call: under contention a multi-threaded call is
sometimes fast and mostly slow)."""


def _torch() -> object | None:
    """torch when it is already imported (a policy that needs it has imported it)."""
    return sys.modules.get("torch")


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch threads, then restore the previous count
    (``None`` or no torch: nothing changes)."""
    torch = _torch()
    if threads is None or torch is None:
        yield
        return
    before = torch.get_num_threads()  # type: ignore[attr-defined]
    if before == threads:
        yield
        return
    torch.set_num_threads(threads)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        torch.set_num_threads(before)  # type: ignore[attr-defined]


def thread_candidates() -> list[int]:
    """The counts calibration compares: 1 and the process's current torch count, capped at
    the cores this process may run on (more threads than cores only queue)."""
    torch = _torch()
    if torch is None:
        return [1]
    now = min(int(torch.get_num_threads()), usable_cores())  # type: ignore[attr-defined]
    return sorted({1, max(1, now)})


def best_threads(call: Callable[[], object], candidates: list[int] | None = None,
                 calls: int = CALIBRATION_CALLS, clock: Callable[[], float] = time.perf_counter) -> int:
    """The thread count among ``candidates`` whose timed ``call()`` has the lowest median; a
    count above the smallest must beat it by :data:`MORE_THREADS_GAIN`."""
    cands = sorted(set(candidates if candidates is not None else thread_candidates()))
    if len(cands) < 2:
        return cands[0] if cands else 1
    times: dict[int, list[float]] = {n: [] for n in cands}
    for n in cands:  # first calls pay for allocation and kernel choice
        with torch_threads(n):
            call()
    for _ in range(calls):  # alternated, so a burst of load hits every count alike
        for n in cands:
            with torch_threads(n):
                t0 = clock()
                call()
                times[n].append(clock() - t0)
    med = {n: statistics.median(ts) for n, ts in times.items()}
    choice = cands[0]
    for n in cands[1:]:
        if med[n] < (1 - MORE_THREADS_GAIN) * med[choice]:
            choice = n
    return choice


def uses_torch(policy: object) -> bool:
    """Whether the thread rule applies to ``policy``."""
    return getattr(policy, "needs_torch", True) is not False and _torch() is not None


class PolicyRunner:
    """Runs ``policy.act`` on rows of the rollout arrays, under the thread rule above.
    ``threads`` is the count chosen (``None`` until the first act, and for a policy
    without torch); :meth:`recalibrate` forgets it (a new batch size, a new device)."""

    def __init__(self, policy: Policy, calibrate: bool = True):
        self.policy = policy
        self.policy_seconds = 0.0
        self.weights_version = -1
        self._mapped: MappedWeights | None = None  # the weights block, once a load mapped it
        self.a: dict[str, np.ndarray] = {}
        self._extras: list[str] = []
        self.calibrate = calibrate
        self.threads: int | None = None
        self.calibration_seconds = 0.0
        self._calibrated = False

    def bind(self, arrays: dict[str, np.ndarray]) -> None:
        self.a = arrays
        self._extras = [k[len("extras."):] for k in arrays if k.startswith("extras.")]

    def load(self, state, version: int) -> None:
        with torch_threads(self._load_threads()):
            self.policy.load_state(state)
        self.weights_version = version

    def load_published(self, name: str, version: int) -> None:
        """Load the shared weights block ``name`` (published as ``version``) straight into the
        policy: the block stays mapped for the next version (see :class:`MappedWeights`)."""
        mapped = self._mapped
        if mapped is None or mapped.name != name:  # the first load, or a block of a new layout
            if mapped is not None:
                mapped.close()
            self._mapped = mapped = MappedWeights(name)
        with torch_threads(self._load_threads()):
            mapped.load_into(self.policy)
        self.weights_version = version

    def _load_threads(self) -> int | None:
        """1 for a load (None: no torch): copying weights is bound by memory, not cores, and
        torch splits a large copy over its threads, which on busy cores wait for each other:
        the Nature CNN's 6.8 MB took a median 16 ms at torch's 2 threads against 0.7 ms at 1
        (measured 2026-11-26 on 2 loaded cores)."""
        return 1 if uses_torch(self.policy) else None

    def recalibrate(self) -> None:
        """Choose the thread count again at the next act."""
        self._calibrated = False
        self.threads = None

    def _threads_for(self, obs: np.ndarray, noise: np.ndarray) -> int | None:
        if not self._calibrated:
            self._calibrated = True
            if self.calibrate and uses_torch(self.policy):
                t0 = time.perf_counter()
                self.threads = best_threads(lambda: self.policy.act(obs, noise))
                self.calibration_seconds += time.perf_counter() - t0
        return self.threads

    def _act(self, obs: np.ndarray, noise: np.ndarray) -> Any:
        """The policy's act, under its calibrated torch thread count; without one (no torch)
        directly: the context manager costs 1-3 us per row, most of a cheap policy's row."""
        threads = self._threads_for(obs, noise)
        if threads is None:
            return self.policy.act(obs, noise)
        with torch_threads(threads):
            return self.policy.act(obs, noise)

    def act(self, ts: np.ndarray, ids: np.ndarray) -> None:
        """Act for the envs ``ids`` at rows ``ts`` (fancy indexing: a gather and a scatter)."""
        a = self.a
        t0 = time.perf_counter()
        obs, noise = a["obs"][ts, ids], a["noise"][ts, ids]
        actions, extras = self._act(obs, noise)
        a["actions"][ts, ids] = actions
        for k in self._extras:
            a["extras." + k][ts, ids] = extras[k]
        self.policy_seconds += time.perf_counter() - t0

    def act_slice(self, t: int, lo: int, hi: int) -> None:
        """Act for envs ``lo..hi-1`` at row ``t`` (the serial loop: contiguous, no gather)."""
        a = self.a
        t0 = time.perf_counter()
        obs, noise = a["obs"][t, lo:hi], a["noise"][t, lo:hi]
        actions, extras = self._act(obs, noise)
        a["actions"][t, lo:hi] = actions
        for k in self._extras:
            a["extras." + k][t, lo:hi] = extras[k]
        self.policy_seconds += time.perf_counter() - t0
