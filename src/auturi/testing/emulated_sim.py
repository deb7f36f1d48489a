"""Envs that emulate a simulator running on *other* cores, for tests and benchmarks.

What it emulates: a step of Pong on a 16-core machine (the GPU box of 2026-11-26,
``../shared/data/gpu-2026-11-26/``) takes a core for about 0.45 ms. Here each step *waits* that
long (``time.sleep``, no CPU), so a 2-core machine can hold as many stepping envs as the
16-core one computes at once: more env workers than cores pay off, as they do there. Step
times have a seeded spread: a lognormal body, rare stragglers (a step ``straggler_factor``
times as long) and long resets, chosen by a named :class:`StepProfile` (:data:`PROFILES`). The
wait of step ``k`` of an env is drawn from ``(its first reset seed, k)`` only (in blocks of
:data:`BLOCK` steps), never from the clock or the layout, so every layout collects exactly the
same data and the same waits: the contract's serial-equality holds, and a stall hits the same
env at the same step whoever steps it.

Observations are ``(4, 84, 84)`` uint8 frame stacks (Pong's after AtariPreprocessing and a
4-frame stack); each new frame depends on the whole action history, so a misplaced action
shows in the data. Rewards are rare +-1 and episodes end terminated, Pong's way.

:class:`SimCores` (optional) is the simulator machine's cores: a pool of ``cores`` slots
shared by every process whose envs name it, held by each step while it waits, so at most
``cores`` envs wait at once, as at most 16 envs compute at once on 16 cores. Without it
every env waits independently (a simulator with a core per env).

What it does not emulate: the CPU an env's step really uses on the simulator's machine (here a
0.45 ms step takes about 40 us of CPU on our 2-core VMs: making and copying the frame, and the
sleep's system call and wake-up; the tuner sees a CPU share of about 9%); memory
bandwidth; a core shared by an env and an actor (Auturi's own work runs on the 2 real cores,
so its overheads weigh 8x more than on 16 cores: the bench's ``--time-scale`` slows every
emulated wait to give them the share they had there). ``time.sleep`` wakes 60-90 us late on
our VMs; :func:`wait_until` learns that lateness per process and sleeps that much less, so a
wait's mean is right, not each wait.

Calibration (``pong-like``, from the GPU record's tuner profile ``tune_pong64.json``): step
mean 0.447 ms, standard deviation 0.076 ms (lognormal sigma 0.17). Not in the record, so
assumed: resets of about 3 ms (AtariPreprocessing's up to 30 no-op frames at about 0.1 ms each,
plus ALE's reset), one step in 1,000 a 5x straggler, episodes of 700-1,000 agent steps (a
random policy loses Pong 21-0 in about that many), a nonzero reward about every 40 steps.
``straggler`` is synthetic: a 0.5 ms body with sigma 0.5, one step in 50 ten times as long,
10 ms resets every 100-300 steps.

This module must not import torch: env workers import it.

Example:
    >>> import gymnasium as gym
    >>> import auturi.envs                      # registers auturi/EmulatedSim-v0 (the module loads lazily)
    >>> env = gym.make("auturi/EmulatedSim-v0", profile="straggler", time_scale=0.01)
    >>> obs, _ = env.reset(seed=3)
    >>> obs.shape, obs.dtype.name
    ((4, 84, 84), 'uint8')
    >>> env.unwrapped.step_seconds_at(0) == EmulatedSimEnv("straggler", time_scale=0.01).seeded(3).step_seconds_at(0)
    True
"""
from __future__ import annotations

import _multiprocessing
import itertools
import math
import os
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any

import gymnasium as gym
import numpy as np

BLOCK = 256
"""Step-time draws are made this many at a time per env (one generator per block)."""

_SALT_STEP, _SALT_EPISODE, _SALT_FRAME = 0x5717, 0xE915, 0xF4A3


@dataclass(frozen=True)
class StepProfile:
    """How long an emulated env's steps and resets wait, and what it looks like (seconds at
    ``time_scale`` 1)."""

    name: str
    description: str
    step_seconds: float
    """Mean of a step's lognormal body."""
    step_sigma: float
    """Standard deviation of the body's log (0: every step waits ``step_seconds``)."""
    straggler_prob: float
    """Chance that a step is a straggler, which waits ``straggler_factor`` times its body."""
    straggler_factor: float
    reset_seconds: float
    """Mean wait of a reset (lognormal, the body's sigma)."""
    episode_steps: tuple[int, int]
    """Episode lengths, drawn uniformly in ``[low, high]`` at each reset."""
    reward_prob: float
    """Chance of a nonzero reward per step (one in ten of them +1, the rest -1)."""
    obs_shape: tuple[int, ...] = (4, 84, 84)
    """uint8 observations: a stack of ``obs_shape[0]`` frames of ``obs_shape[1:]``."""
    num_actions: int = 6

    def mean_step_seconds(self) -> float:
        """An env's expected wait per step, its resets shared out over its episodes.

        >>> round(PROFILES["pong-like"].mean_step_seconds() * 1e3, 3)
        0.452
        """
        p = self.straggler_prob
        body = self.step_seconds * (1.0 - p + p * self.straggler_factor)
        return body + self.reset_seconds / (sum(self.episode_steps) / 2.0)


PROFILES: dict[str, StepProfile] = {p.name: p for p in [
    StepProfile("pong-like", "Atari Pong on one core of the 16-core GPU box: 0.45 ms steps, 3 ms resets",
                step_seconds=0.447e-3, step_sigma=0.17, straggler_prob=0.001, straggler_factor=5.0,
                reset_seconds=3e-3, episode_steps=(700, 1000), reward_prob=0.025),
    StepProfile("straggler", "a heavy tail: 0.5 ms lognormal steps (sigma 0.5), one in 50 ten times as long, "
                             "10 ms resets every 100-300 steps",
                step_seconds=0.5e-3, step_sigma=0.5, straggler_prob=0.02, straggler_factor=10.0,
                reset_seconds=10e-3, episode_steps=(100, 300), reward_prob=0.025),
]}
"""The named step-time profiles (see the module's docstring for their calibration)."""


def get_profile(profile: str | StepProfile) -> StepProfile:
    """A profile by name (``ValueError`` lists the names), or ``profile`` itself."""
    if isinstance(profile, StepProfile):
        return profile
    try:
        return PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown emulated-sim profile {profile!r}; choose one of {sorted(PROFILES)}") from None


# ---------------------------------------------------------------------------- waiting
MAX_LATENESS = 2e-4
_lateness = [60e-6]  # this process's estimate of how late time.sleep wakes (timer slack + wake-up)


def wait_until(deadline: float) -> None:
    """Block (no CPU) until ``time.perf_counter()`` reaches ``deadline``, on average.

    ``time.sleep`` wakes 60-90 us late here (the kernel's 50 us timer slack plus the wake-up),
    17% of a 0.45 ms step. Each call sleeps the process's current estimate of that lateness
    less (not at all for a wait shorter than it) and moves the estimate a tenth of the way by
    how late or early it ended, so the mean error converges on zero; one wait may end ~0.1 ms
    early or late. The estimate stays within [0, 0.2 ms]: a loaded machine's wake-ups, late by
    milliseconds, once drove it past every step's wait, and every step was then skipped."""
    remaining = deadline - time.perf_counter()
    if remaining > _lateness[0]:
        time.sleep(remaining - _lateness[0])
    elif remaining <= 0:
        return  # past due before it began (a queued step): nothing to learn about sleeping
    error = min(max(time.perf_counter() - deadline, -MAX_LATENESS), MAX_LATENESS)
    _lateness[0] = min(max(_lateness[0] + 0.1 * error, 0.0), MAX_LATENESS)


# ---------------------------------------------------------------------------- simulator cores
_pool_ids = itertools.count()


class SimCores:
    """The simulator machine's ``cores``: a POSIX named semaphore of ``cores`` slots, shared by
    every process stepping an env made with ``sim_cores=pool.name``. A step holds a slot while
    it waits, so at most ``cores`` envs wait at once, whatever the layout.

    Create it in the caller, before the envs, and keep it open while they step (a ``with``
    block); :meth:`close` unlinks the name from ``/dev/shm`` (``sem.auturi_<pid>_simcores*``),
    as does the end of the process. Processes that opened it keep their handle; an env that
    opens it after the close raises, naming the fix. A process killed while its env held a
    slot leaves that slot taken until the pool is closed.

    >>> with SimCores(16) as pool:
    ...     env = EmulatedSimEnv("pong-like", time_scale=0.01, sim_cores=pool.name)
    ...     _ = env.reset(seed=0)
    ...     _ = env.step(0)
    >>> pool.cores
    16
    """

    def __init__(self, cores: int):
        if int(cores) < 1:
            raise ValueError(f"SimCores needs at least one core, not {cores}")
        self.cores = int(cores)
        self.name = f"/auturi_{os.getpid()}_simcores{next(_pool_ids)}x{self.cores}"
        self._sem = _multiprocessing.SemLock(1, self.cores, self.cores, self.name, False)  # kind 1: a semaphore
        self._finalizer = weakref.finalize(self, _unlink, self.name)

    def close(self) -> None:
        """Unlink the name (idempotent)."""
        self._finalizer()

    def __enter__(self) -> "SimCores":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _unlink(name: str) -> None:
    try:
        _multiprocessing.sem_unlink(name)
    except FileNotFoundError:
        pass


def _open_pool(name: str) -> Any:
    try:
        cores = int(name.rsplit("x", 1)[1])
        return _multiprocessing.SemLock._rebuild(0, 1, cores, name)
    except (IndexError, ValueError):
        raise ValueError(f"sim_cores={name!r} is not a SimCores name; pass SimCores(n).name") from None
    except FileNotFoundError:
        raise RuntimeError(f"the emulated simulator's cores {name!r} are closed: make and step the envs inside "
                           f"`with SimCores(n) as pool:` (or leave sim_cores=None)") from None


# ---------------------------------------------------------------------------- the env
class EmulatedSimEnv(gym.Env):
    """An env whose steps wait as a simulator on another core would compute (see the module's
    docstring). ``profile``: a name of :data:`PROFILES` or a :class:`StepProfile`;
    ``time_scale`` multiplies every wait; ``sim_cores``: a :class:`SimCores` name, or None;
    ``overrides``: fields of the profile to change (``step_seconds=1e-3``)."""

    metadata: dict = {"render_modes": []}

    def __init__(self, profile: str | StepProfile = "pong-like", time_scale: float = 1.0,
                 sim_cores: str | None = None, **overrides: Any):
        prof = get_profile(profile)
        self.profile = replace(prof, **overrides) if overrides else prof
        if time_scale < 0:
            raise ValueError(f"time_scale must be >= 0, not {time_scale}")
        self.time_scale = float(time_scale)
        self.sim_cores = sim_cores
        if len(self.profile.obs_shape) < 2:
            raise ValueError(f"obs_shape must be (frames, *frame_shape), not {self.profile.obs_shape}")
        self.observation_space = gym.spaces.Box(0, 255, self.profile.obs_shape, np.uint8)
        self.action_space = gym.spaces.Discrete(self.profile.num_actions)
        p = self.profile
        self._mu = math.log(p.step_seconds) - p.step_sigma ** 2 / 2 if p.step_seconds > 0 else None
        self._pool: Any = None
        self._stack = np.zeros(p.obs_shape, np.uint8)
        self._rekey(0)  # until the first seeded reset
        self.last_step_seconds = 0.0
        """The wait drawn for the last step (before any time slept)."""

    # Moves between processes (cloudpickle of the live env) keep every counter; the pool's
    # handle is reopened by name where the env lands.
    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_pool"] = None
        return d

    def _rekey(self, seed: int) -> None:
        self._key = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
        self._steps = 0      # steps since the seeded reset: what a step's wait is drawn from
        self._episode = 0
        self._t, self._len, self._state = 0, 1, 0
        self._block_index, self._waits, self._reward_u = -1, [], []
        frame_shape = self.profile.obs_shape[1:]
        self._base = np.random.default_rng([_SALT_FRAME, self._key]).integers(0, 256, frame_shape, np.uint8)

    def seeded(self, seed: int) -> "EmulatedSimEnv":
        """Key the draws to ``seed`` without waiting (as ``reset(seed=seed)`` does); returns self."""
        self._rekey(seed)
        return self

    def step_seconds_at(self, step: int) -> float:
        """The wait of step ``step`` (counting from 0 at the seeded reset) of this env."""
        return self._draw(step)[0]

    def _draw(self, step: int) -> tuple[float, float]:
        b, i = divmod(step, BLOCK)
        if b != self._block_index:
            p = self.profile
            rng = np.random.default_rng([_SALT_STEP, self._key, b])
            z, u = rng.standard_normal(BLOCK), rng.random((2, BLOCK))
            if self._mu is None:
                waits = np.zeros(BLOCK)
            else:
                waits = np.exp(self._mu + p.step_sigma * z) * self.time_scale
                waits = np.where(u[0] < p.straggler_prob, waits * p.straggler_factor, waits)
            self._block_index, self._waits, self._reward_u = b, waits.tolist(), u[1].tolist()
        return self._waits[i], self._reward_u[i]

    def _hold(self, seconds: float, t0: float) -> None:
        """Wait until ``seconds`` after ``t0``, holding a simulator core if there is a pool
        (from when one is free: a step that queued for a core computes after it gets one)."""
        if self.sim_cores is None:
            wait_until(t0 + seconds)
            return
        if self._pool is None:
            self._pool = _open_pool(self.sim_cores)
        if not self._pool.acquire(False):
            self._pool.acquire()
            t0 = time.perf_counter()
        try:
            wait_until(t0 + seconds)
        finally:
            self._pool.release()

    def _frame(self, value: int) -> None:
        st = self._stack
        st[:-1] = st[1:]  # numpy copies overlapping slices correctly
        np.bitwise_xor(self._base, np.uint8(value & 0xFF), out=st[-1])

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        t0 = time.perf_counter()
        super().reset(seed=seed)
        if seed is not None:
            self._rekey(seed)
        p = self.profile
        rng = np.random.default_rng([_SALT_EPISODE, self._key, self._episode])
        lo, hi = p.episode_steps
        self._len = int(rng.integers(lo, hi + 1))
        self._state = int(rng.integers(0, 65521))
        body = math.exp(p.step_sigma * rng.standard_normal() - p.step_sigma ** 2 / 2)  # lognormal, mean 1
        wait = p.reset_seconds * self.time_scale * body
        self._episode += 1
        self._t = 0
        for k in range(len(self._stack)):
            self._frame(self._state + k)
        self._hold(wait, t0)
        return self._stack.copy(), {}

    def step(self, action):
        t0 = time.perf_counter()
        wait, u = self._draw(self._steps)
        self.last_step_seconds = wait
        self._steps += 1
        self._t += 1
        self._state = (self._state * 31 + int(action) + 7) % 65521
        self._frame(self._state ^ self._t)
        p = self.profile
        reward = 0.0 if u >= p.reward_prob else (1.0 if u < 0.1 * p.reward_prob else -1.0)
        obs = self._stack.copy()
        self._hold(wait, t0)
        return obs, reward, self._t >= self._len, False, {}

    def close(self) -> None:
        self._pool = None
