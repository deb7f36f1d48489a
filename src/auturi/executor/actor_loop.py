"""One actor's collection loop: the ping-pong between its envs and its policy replicas.

The loop sees "lanes": ``env_parallel_degree`` env lanes, each stepping its share of the
actor's envs in turn, and ``policies_per_actor`` policy lanes. A lane is local (runs in this
process, synchronously) or remote (a worker process woken by a semaphore). The loop hands
whichever envs are ready to a free policy lane, at most ``policy_batch_size`` at a time, and
envs whose actions are ready to their env lane. Each env steps exactly ``num_steps`` times.

Because every env's data goes to its own column and every random number is drawn per env
and step, the order in which lanes finish never changes the data.

Bookkeeping is done on numpy arrays of env indices, never per env in Python: with 64 envs
per actor, per-env Python work in this loop cost more than stepping CartPole itself.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Protocol, Sequence

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


class Lane(Protocol):
    remote: bool
    name: str

    def submit(self, ts: np.ndarray, ids: np.ndarray) -> None: ...


def slice_stepper(runner) -> Callable[[int, int, int], None]:
    """``runner.step_slice``, or the same through ``runner.step`` for runners without it."""
    fast = getattr(runner, "step_slice", None)
    if fast is not None:
        return fast

    def step(t: int, lo: int, hi: int) -> None:
        runner.step(np.full(hi - lo, t, dtype=np.int64), np.arange(lo, hi, dtype=np.int64))

    return step


class _Queue:
    """A FIFO of env indices kept as a list of arrays."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []
        self.size = 0

    def push(self, a: np.ndarray) -> None:
        if len(a):
            self.parts.append(a)
            self.size += len(a)

    def pop(self, k: int) -> np.ndarray:
        allv = self.parts[0] if len(self.parts) == 1 else np.concatenate(self.parts)
        out, rest = allv[:k], allv[k:]
        self.parts = [rest] if len(rest) else []
        self.size = len(rest)
        return out


class ActorLoop:
    """Schedules one actor's envs over its lanes.

    ``wait`` blocks until at least one remote lane has finished and returns those lanes
    (it raises :class:`auturi.WorkerError` on a failure); it is only called while some
    remote lane is busy. ``row_group(remote_env_lanes)`` (needed when there are remote env
    lanes) makes the object the lockstep loop posts a row to and awaits (``step_row(t)``,
    ``wait()``, and ``settle()`` after the last row).

    ``lockstep`` (``ActorPlan.lockstep``) picks the row-by-row loop over the general one.

    ``beat`` (an int64 memoryview and an index) is bumped once per row (lockstep) or per wait:
    whoever waits for this actor reads it to tell a busy actor from a stuck one (``shm``'s
    ``Waiter``); one integer store, no clock.
    """

    def __init__(self, env_ids: Sequence[int], env_lanes: list[Lane], policy_lanes: list[Lane],
                 batch_size: int, wait: Callable[[], list[Lane]], row_group: Callable[[list], Any] | None = None,
                 beat: tuple[Any, int] | None = None, lockstep: bool = False):
        self.env_ids = np.asarray(env_ids, dtype=np.int64)
        self.beat = beat if beat is not None else (memoryview(np.zeros(1, np.int64)), 0)
        self.env_lanes, self.policy_lanes = env_lanes, policy_lanes
        self.batch_size = batch_size
        self.wait = wait
        self.per_lane = len(env_ids) // len(env_lanes)
        self.wait_seconds = 0.0
        self._index = {id(lane): ("env", k) for k, lane in enumerate(env_lanes)}
        self._index.update({id(lane): ("pol", k) for k, lane in enumerate(policy_lanes)})
        self._lockstep = None
        # Remote lanes first: they work in parallel while a local lane steps synchronously.
        self._dispatch_order = sorted(enumerate(env_lanes), key=lambda dl: not dl[1].remote)
        pol0 = policy_lanes[0]
        if lockstep:
            # Lockstep (the layout plan decides it: ``ActorPlan.lockstep``): one in-process
            # replica acting for all envs at once, so every env is always at the same row:
            # act on a contiguous slice, hand each env lane its fixed envs, wait for the
            # remote ones. No per-env bookkeeping at all. With one local env lane this is
            # the serial point (DummyVecEnv), with no IPC.
            if len(policy_lanes) != 1 or pol0.remote or batch_size < len(env_ids):
                raise ValueError("lockstep needs one in-process policy lane whose batch holds every env "
                                 "(see auturi.executor.layout: ActorPlan.lockstep)")
            lo, hi = int(self.env_ids[0]), int(self.env_ids[-1]) + 1
            per = self.per_lane
            act = pol0.runner.act_slice  # type: ignore[attr-defined]
            remotes = [lane for lane in env_lanes if lane.remote]
            if remotes and row_group is None:
                raise ValueError("remote env lanes need a row_group to step them in lockstep")
            # Remote lanes are posted and awaited all at once (shm: RowGroup).
            group = row_group(remotes) if remotes else None
            locals_ = [(slice_stepper(lane.runner), lo + d * per, lo + (d + 1) * per)  # type: ignore[attr-defined]
                       for d, lane in enumerate(env_lanes) if not lane.remote]

            beats, k = self.beat
            self._lockstep = self._lockstep_rows(act, lo, hi, group, locals_, beats, k)

    def _lockstep_rows(self, act: Callable, lo: int, hi: int, group: Any, locals_: list, beats: Any,
                       k: int) -> Callable[[int], None]:
        """The row loop of lockstep: act for all envs, post the row to the remote lanes, step
        the local share, await the remote ones. Every name the loop touches is a local of the
        closure: at one env per context (``bench/envstep.py``, N = 1 and 2) this loop's own
        lines were a measurable share of a row."""
        if group is None and len(locals_) == 1:
            step, a, b = locals_[0]  # the serial point: no IPC, one local share

            def serial(num_steps: int) -> None:
                for t in range(num_steps):
                    beats[k] += 1
                    act(t, lo, hi)
                    step(t, a, b)

            return serial
        now = time.perf_counter

        def rows(num_steps: int) -> None:
            post, wait = (group.step_row, group.wait) if group is not None else (None, None)
            waited = 0.0
            try:
                for t in range(num_steps):
                    beats[k] += 1
                    act(t, lo, hi)
                    if post is not None:  # first: they work while this process steps its share
                        post(t)
                    for step, a, b in locals_:
                        step(t, a, b)
                    if wait is not None:
                        t0 = now()
                        wait()
                        waited += now() - t0
            finally:
                self.wait_seconds += waited
                if group is not None:
                    group.settle()

        return rows

    def run(self, num_steps: int) -> None:
        if self._lockstep is not None:
            return self._lockstep(num_steps)
        n, B, D = len(self.env_ids), self.batch_size, len(self.env_lanes)
        ids, per_lane = self.env_ids, self.per_lane
        t = np.zeros(n, dtype=np.int64)
        ready = _Queue()  # local env indices whose observation awaits an action
        ready.push(np.arange(n, dtype=np.int64))
        pending = [_Queue() for _ in range(D)]  # actions ready, env lane still busy
        n_pending = 0
        env_busy: dict[int, np.ndarray] = {}  # remote env lane -> envs it is stepping
        pol_busy: dict[int, np.ndarray] = {}  # remote policy lane -> envs it is acting for
        free_pol = list(range(len(self.policy_lanes)))
        in_env = 0
        finished = 0
        beats, k_beat = self.beat

        def env_done(batch: np.ndarray) -> None:
            nonlocal finished
            t[batch] += 1
            alive = batch[t[batch] < num_steps]
            finished += len(batch) - len(alive)
            ready.push(alive)

        def policy_done(batch: np.ndarray) -> None:
            nonlocal n_pending
            n_pending += len(batch)
            if D == 1:
                pending[0].push(batch)
                return
            lanes = batch // per_lane
            for d in np.unique(lanes).tolist():
                pending[d].push(batch[lanes == d])

        while finished < n:
            progress = True
            while progress:
                progress = False
                beats[k_beat] += 1  # a scheduling round: progress, for whoever waits for this actor
                # Policy side: full batches, or a smaller one when no env is stepping or
                # waiting to step, since then waiting could not fill it.
                while free_pol and ready.size and (ready.size >= B or (in_env == 0 and n_pending == 0)):
                    p = free_pol.pop()
                    batch = ready.pop(B)
                    lane = self.policy_lanes[p]
                    lane.submit(t[batch], ids[batch])
                    if lane.remote:
                        pol_busy[p] = batch
                    else:
                        free_pol.append(p)
                        policy_done(batch)
                        progress = True
                # Env side: each free lane steps every env whose action is ready.
                if n_pending:
                    for d, lane in self._dispatch_order:
                        if pending[d].size and d not in env_busy:
                            batch = pending[d].pop(pending[d].size)
                            n_pending -= len(batch)
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
            done = self.wait()
            self.wait_seconds += time.perf_counter() - t0
            for lane in done:
                kind, k = self._index[id(lane)]
                if kind == "env":
                    batch = env_busy.pop(k)
                    in_env -= len(batch)
                    env_done(batch)
                else:
                    policy_done(pol_busy.pop(k))
                    free_pol.append(k)
