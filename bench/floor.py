"""The floor of the env-parallel layout: a bare prototype of "one env per process, woken by a
semaphore over shared memory", with none of the executor's bookkeeping (no rollout arrays, no
policy, no seeds, no error handling). `bench/envstep.py` runs it beside Auturi's degree-N
config so the distance between the two is measured in the same run: it is the most any
change to the executor's per-row path could gain.

Each worker steps its CartPole with action 0 (a numpy integer, as Auturi and SB3's VecEnvs hand
envs their actions: gymnasium checks one 1.2 us slower than a Python int) when its semaphore is
posted and posts a shared done semaphore; the caller posts all workers and takes N posts. Waits poll with
``sched_yield`` for up to 1 ms before blocking: Auturi's own ``channel.acquire``.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import numpy as np

from auturi.executor.shm.channel import SPIN_SECONDS, acquire

ACTION = np.zeros(1, np.int64)[0]
"""The action every env steps with: ``numpy.int64(0)``, what an action row's element is."""


def _worker(i: int, start: Any, done: Any, stop: Any, spin: float) -> None:
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    env.reset(seed=i)
    while True:
        acquire(start, spin, None)
        if stop.value:
            return
        _, _, te, tr, _ = env.step(ACTION)
        if te or tr:
            env.reset()
        done.release()


class FloorRunner:
    """``n`` worker processes (forkserver), one CartPole each; ``run(rows)`` steps them all
    ``rows`` times and returns env steps per second.

    ``caller_env``: the caller steps one of the ``n`` CartPoles itself, between posting the
    ``n - 1`` workers and waiting for them, as Auturi's actor steps its share at degree N
    (``floor_caller`` in ``bench/envstep.py``). Measured beside ``floor`` it tells what that
    layout choice costs apart from the executor's bookkeeping."""

    kind = "floor"

    def __init__(self, n: int, spin: float = SPIN_SECONDS, caller_env: bool = False):
        ctx = mp.get_context("forkserver")
        self.n, self.spin = n, spin
        self.env = None
        if caller_env:
            import gymnasium as gym

            self.env = gym.make("CartPole-v1")
            self.env.reset(seed=0)
        workers = range(1, n) if caller_env else range(n)
        self.done = ctx.Semaphore(0)
        self.stop = ctx.Value("b", 0, lock=False)
        self.starts = [ctx.Semaphore(0) for _ in workers]
        self.procs = [ctx.Process(target=_worker, args=(i, s, self.done, self.stop, spin), daemon=True)
                      for i, s in zip(workers, self.starts)]
        for p in self.procs:
            p.start()
        self.run(16)

    def run(self, rows: int) -> float:
        env, spin, done, starts = self.env, self.spin, self.done, self.starts
        t0 = time.perf_counter()
        for _ in range(rows):
            for s in starts:
                s.release()
            if env is not None:
                _, _, te, tr, _ = env.step(ACTION)
                if te or tr:
                    env.reset()
            for _ in starts:
                acquire(done, spin, None)
        return rows * self.n / (time.perf_counter() - t0)

    def close(self) -> None:
        self.stop.value = 1
        for s in self.starts:
            s.release()
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
