"""One actor's collection loop: the ping-pong between its envs and its policy replicas.

The loop sees "lanes": ``env_parallel_degree`` env lanes, each stepping its share of the
actor's envs in turn, and ``policies_per_actor`` policy lanes. A lane is local (runs in this
process, synchronously) or remote (a worker process woken by a semaphore). The loop hands
whichever envs are ready to a free policy lane, at most ``policy_batch_size`` at a time, and
envs whose actions are ready to their env lane. Each env steps exactly ``num_steps`` times.

Because every env's data goes to its own column and every random number is drawn per env
and step, the order in which lanes finish never changes the data.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable, Protocol, Sequence

import numpy as np


class Lane(Protocol):
    remote: bool
    name: str

    def submit(self, ts: Sequence[int], ids: Sequence[int]) -> None: ...


class ActorLoop:
    """Schedules one actor's envs over its lanes.

    ``wait`` blocks until at least one remote lane has finished and returns those lanes
    (it raises :class:`auturi.WorkerError` on a failure); it is only called while some
    remote lane is busy.
    """

    def __init__(self, env_ids: Sequence[int], env_lanes: list[Lane], policy_lanes: list[Lane],
                 batch_size: int, wait: Callable[[list[Lane]], list[Lane]]):
        self.env_ids = np.asarray(env_ids, dtype=np.int64)
        self.env_lanes, self.policy_lanes = env_lanes, policy_lanes
        self.batch_size = batch_size
        self.wait = wait
        per_lane = len(env_ids) // len(env_lanes)
        self.lane_of = [k // per_lane for k in range(len(env_ids))]
        self.wait_seconds = 0.0
        self._plain_loop = None
        env0, pol0 = env_lanes[0], policy_lanes[0]
        if (len(env_lanes) == 1 and len(policy_lanes) == 1 and not env0.remote and not pol0.remote
                and batch_size >= len(env_ids)):
            # The serial point (DummyVecEnv): no scheduling at all, one contiguous slice per row.
            lo, hi = int(self.env_ids[0]), int(self.env_ids[-1]) + 1
            ids_list = self.env_ids.tolist()

            def plain(num_steps: int) -> None:
                for t in range(num_steps):
                    pol0.runner.act_slice(t, lo, hi)  # type: ignore[attr-defined]
                    env0.runner.step([t] * len(ids_list), ids_list)  # type: ignore[attr-defined]

            self._plain_loop = plain

    def run(self, num_steps: int) -> None:
        if self._plain_loop is not None:
            return self._plain_loop(num_steps)
        n, B = len(self.env_ids), self.batch_size
        ids = self.env_ids
        t = np.zeros(n, dtype=np.int64)
        ready: deque[int] = deque(range(n))  # local env indices whose obs awaits an action
        pending: list[list[int]] = [[] for _ in self.env_lanes]  # actions ready, lane busy
        env_busy: dict[int, list[int]] = {}  # remote env lane -> envs it is stepping
        pol_busy: dict[int, list[int]] = {}  # remote policy lane -> envs it is acting for
        free_pol = deque(range(len(self.policy_lanes)))
        in_env = 0
        finished = 0
        lanes_index = {id(l): ("env", k) for k, l in enumerate(self.env_lanes)}
        lanes_index.update({id(l): ("pol", k) for k, l in enumerate(self.policy_lanes)})

        def env_done(batch: list[int]) -> None:
            nonlocal finished
            for k in batch:
                t[k] += 1
                if t[k] < num_steps:
                    ready.append(k)
                else:
                    finished += 1

        def policy_done(batch: list[int]) -> None:
            for k in batch:
                pending[self.lane_of[k]].append(k)

        while finished < n:
            progress = True
            while progress:
                progress = False
                # Policy side: full batches, or a smaller one when no env is stepping,
                # since then waiting could not fill it.
                while free_pol and ready and (len(ready) >= B or (in_env == 0 and not any(pending))):
                    p = free_pol.popleft()
                    batch = [ready.popleft() for _ in range(min(B, len(ready)))]
                    lane = self.policy_lanes[p]
                    lane.submit(t[batch], ids[batch])
                    if lane.remote:
                        pol_busy[p] = batch
                    else:
                        free_pol.append(p)
                        policy_done(batch)
                        progress = True
                # Env side: each free lane steps every env whose action is ready.
                for d, lane in enumerate(self.env_lanes):
                    if pending[d] and d not in env_busy:
                        batch, pending[d] = pending[d], []
                        lane.submit(t[batch], ids[batch])
                        if lane.remote:
                            env_busy[d] = batch
                            in_env += len(batch)
                        else:
                            env_done(batch)
                            progress = True
            if finished == n:
                break
            t0 = time.perf_counter()
            done = self.wait([self.env_lanes[d] for d in env_busy] + [self.policy_lanes[p] for p in pol_busy])
            self.wait_seconds += time.perf_counter() - t0
            for lane in done:
                kind, k = lanes_index[id(lane)]
                if kind == "env":
                    batch = env_busy.pop(k)
                    in_env -= len(batch)
                    env_done(batch)
                else:
                    policy_done(pol_busy.pop(k))
                    free_pol.append(k)
