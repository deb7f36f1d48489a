"""The floor of the env-parallel layout: a bare prototype of "one env per process, woken by a
semaphore over shared memory", with none of the executor's bookkeeping (no rollout arrays, no
policy, no seeds, no error handling). `bench/envstep.py` runs it beside Auturi's degree-N
config so the distance between the two is measured in the same run: it is the most any
change to the executor's per-row path could gain.

Each worker steps its CartPole with action 0 when its semaphore is posted and posts a shared
done semaphore; the caller posts all workers and takes N posts. Waits poll with
``sched_yield`` for up to 1 ms before blocking: Auturi's own ``channel.acquire``.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

from auturi.executor.shm.channel import SPIN_SECONDS, acquire

def _worker(i: int, start: Any, done: Any, stop: Any, spin: float) -> None:
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    env.reset(seed=i)
    while True:
        acquire(start, spin, None)
        if stop.value:
            return
        _, _, te, tr, _ = env.step(0)
        if te or tr:
            env.reset()
        done.release()


class FloorRunner:
    """``n`` worker processes (forkserver), one CartPole each; ``run(rows)`` steps them all
    ``rows`` times and returns env steps per second."""

    kind = "floor"

    def __init__(self, n: int, spin: float = SPIN_SECONDS):
        ctx = mp.get_context("forkserver")
        self.n, self.spin = n, spin
        self.done = ctx.Semaphore(0)
        self.stop = ctx.Value("b", 0, lock=False)
        self.starts = [ctx.Semaphore(0) for _ in range(n)]
        self.procs = [ctx.Process(target=_worker, args=(i, s, self.done, self.stop, spin), daemon=True)
                      for i, s in enumerate(self.starts)]
        for p in self.procs:
            p.start()
        self.run(16)

    def run(self, rows: int) -> float:
        t0 = time.perf_counter()
        for _ in range(rows):
            for s in self.starts:
                s.release()
            for _ in range(self.n):
                acquire(self.done, self.spin, None)
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
