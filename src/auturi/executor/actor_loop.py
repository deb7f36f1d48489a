"""One actor's collection loop: the ping-pong between its envs and its policy replicas.

Over 400 lines on purpose: the three loops (lockstep, overlapped, general) share the lanes'
bookkeeping and each is the hot path of its layouts; split, each would need the others'
queues and counters.

The loop sees "lanes": ``env_parallel_degree`` env lanes, each stepping its share of the
actor's envs in turn, and ``policies_per_actor`` policy lanes. A lane is local (runs in this
process, synchronously) or remote (a worker process woken by a semaphore). The loop hands
whichever envs are ready to a free policy lane, at most ``policy_batch_size`` at a time, and
envs whose actions are ready to their env lane. Each env steps exactly ``num_steps`` times.

Three loops, which the layout plan picks (``ActorPlan.lockstep``, ``ActorPlan.overlap``):

- lockstep: one in-process replica acts for every env at once, row by row;
- overlapped (a policy on a device, env workers, more than one forward pass per row: several
  batches or replicas of their own): whichever envs are ready go to a free policy lane, the
  furthest behind first (:func:`pick_batch`: the last env to finish ends the collect), and a
  smaller batch once the envs stepping could not fill it; each batch is spread over the env
  shares (round-robin at first, :func:`spread_batch`), so a worker's envs land in different
  batches; env workers queue the steps of several batches
  (``shm.channel.TaskQueues``), so a worker steps one batch's envs while another batch is in
  inference and goes on to the next without a round trip to the actor (Sample Factory's
  alternating halves, EnvPool's first-ready batches); the actor steps its own share while
  inference runs, on a thread of its own once those steps are long (``OWN_THREAD_SECONDS``:
  a straggler or reset there no longer holds back every batch's dispatch);
- general: whichever envs are ready go to a free policy lane, and envs with actions to their
  env lane when it is idle (the serial backend, layouts without env workers, CPU policies:
  there inference shares the cores with the env workers, and spreading batches over the
  workers cost more wake-ups than it hid).

Because every env's data goes to its own column and every random number is drawn per env
and step, the order in which lanes finish never changes the data.

Bookkeeping is done on numpy arrays of env indices, never per env in Python: with 64 envs
per actor, per-env Python work in this loop cost more than stepping CartPole itself.

Over 400 lines: the three loops read the same lanes and keep the same promise (each env
steps ``num_steps`` times, the data is the serial loop's); they are read together.

Measured (2026-11-26, 2 shared cores; the emulated GPU box: Pong-like envs at time scale 4,
16 emulated simulator cores, the emulated H200 policy; ``python -m bench.emulated_gpu``):
1 actor x 32 envs, degree 16, 2 CUDA replicas of batch 16 collected 4,411 steps/s
overlapped against 2,980 in the general loop (5 interleaved rounds); CartPole with a CPU
MLP, 16 envs, degree 4, batch 4, 2,592 overlapped against 4,157 general: hence CPU policies
keep the general loop.
"""
from __future__ import annotations

import queue
import threading
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

    def pop_part(self) -> np.ndarray:
        """The oldest array pushed (or what is left of it)."""
        out = self.parts.pop(0)
        self.size -= len(out)
        return out

    def pop(self, k: int) -> np.ndarray:
        allv = self.parts[0] if len(self.parts) == 1 else np.concatenate(self.parts)
        out, rest = allv[:k], allv[k:]
        self.parts = [rest] if len(rest) else []
        self.size = len(rest)
        return out


def spread_batch(ready: np.ndarray, size: int, per_share: int, quota: int) -> tuple[np.ndarray, np.ndarray]:
    """``(batch, rest)``: up to ``size`` envs of ``ready`` (local env indices, first come
    first), taking at most ``quota`` envs of each share (``env // per_share``) while other
    shares have envs to give, then topping the batch up first come first; both keep
    ``ready``'s order. Spread this way, a batch's steps land on as many env lanes as it can,
    and a lane's envs on different batches, which is what lets one batch step while another
    is in inference; a lane that falls behind (a straggler) holds no batch back.

    >>> b, rest = spread_batch(np.array([0, 1, 2, 3, 4, 5]), 3, per_share=2, quota=1)
    >>> b.tolist(), rest.tolist()
    ([0, 2, 4], [1, 3, 5])
    >>> spread_batch(np.array([0, 1, 2, 3]), 3, per_share=2, quota=1)[0].tolist()  # topped up
    [0, 1, 2]
    """
    if len(ready) <= size:
        return ready, _EMPTY
    shares = ready // per_share
    order = np.argsort(shares, kind="stable")
    sorted_shares = shares[order]
    starts = np.flatnonzero(np.r_[True, sorted_shares[1:] != sorted_shares[:-1]])
    rank = np.empty(len(ready), dtype=np.int64)  # how many envs of its share come before it
    rank[order] = np.arange(len(ready)) - np.repeat(starts, np.diff(np.r_[starts, len(ready)]))
    take = rank < quota
    picked = np.flatnonzero(take)
    if len(picked) > size:
        take[picked[size:]] = False
    elif len(picked) < size:
        more = np.flatnonzero(~take)[:size - len(picked)]
        take[more] = True
    return ready[take], ready[~take]


def pick_batch(ready: np.ndarray, rows: np.ndarray, size: int, per_share: int, quota: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """``(batch, rest)``: the envs of ``ready`` (local env indices, in arrival order; ``rows``
    their rows) that go to one forward pass of at most ``size``: the envs furthest behind
    first (first come among equals), spread over the shares by :func:`spread_batch`.

    Why the furthest behind: a collect ends when its last env has stepped ``num_steps``
    times, so an env that fell behind (a straggler step, a reset) sets the collect's end; first
    come first would keep serving the envs ahead while it catches up alone, and the simulator
    cores idle at the end. Which batch an env goes to never changes its data.

    >>> b, rest = pick_batch(np.array([4, 0, 2, 6]), np.array([5, 5, 3, 4]), 2, per_share=2, quota=2)
    >>> b.tolist(), rest.tolist()
    ([2, 6], [4, 0])
    """
    if len(ready) > size:
        order = np.argsort(rows, kind="stable")
        ready = ready[order]
    if quota >= per_share:
        return ready[:size], ready[size:]
    return spread_batch(ready, size, per_share, quota)


OWN_THREAD_SECONDS = 2e-4
"""An actor's own env share steps on a thread of its own in the overlapped loop once a task of
it (the envs of it handed on at once) takes this long on average; shorter ones step in the
loop. Measured (2026-11-26, 2 shared cores, an emulated CUDA policy, interleaved rounds):
on the emulated straggler box (2.6 ms steps with rare 10x ones, which stopped every batch's
dispatch while the actor stepped one) the thread gave 1x32 degree 32 with 4 replicas 4,241
steps/s against 3,629, 8 replicas of batch 2 4,493 against 3,631; on CartPole (10 us steps,
1 x 16, degree 2 or 4) it cost 7-16% (a hand-off per task costs more than the steps); on an
env that computes 0.2 ms steps in Python (holding the GIL, so the thread runs only while the
loop waits) it was even (-3%..+2%)."""


class _OwnShare:
    """The envs the overlapped loop's own process steps (share 0): in the loop while their
    tasks are short, on a thread once they take ``OWN_THREAD_SECONDS`` on average, so that a
    long step there (a straggler, a reset, a remote simulator's wait) no longer holds back
    every other batch's dispatch. Which thread steps an env never changes its data.

    ``report`` is called on the thread after each task (``TaskQueues.local_report``: it wakes
    a loop waiting for its lanes). The thread lives for one collect (:meth:`stop`)."""

    def __init__(self, env_lanes: list, per_lane: int, ids: np.ndarray):
        self.env_lanes, self.per_lane, self.ids = env_lanes, per_lane, ids
        self.mean = 0.0  # a task's wall seconds, averaged; kept across collects
        self.busy = False  # a task is on the thread, not taken back yet
        self.error: BaseException | None = None
        self._done: queue.SimpleQueue = queue.SimpleQueue()  # tasks the thread finished
        self._waited: list[np.ndarray] = []  # ... and those :meth:`wait` took off it
        self._tasks: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None

    def threaded(self) -> bool:
        return self.mean >= OWN_THREAD_SECONDS

    def step(self, batch: np.ndarray, t: np.ndarray) -> None:
        """Step ``batch`` (local env indices) at rows ``t[batch]`` here and now."""
        t0 = time.perf_counter()
        shares = batch // self.per_lane
        for d in np.unique(shares).tolist():
            sub = batch[shares == d]
            self.env_lanes[d].submit(t[sub], self.ids[sub])
        seconds = time.perf_counter() - t0
        self.mean = self.mean + 0.2 * (seconds - self.mean) if self.mean else seconds

    def start(self, batch: np.ndarray, t: np.ndarray, report: Callable[[], None]) -> None:
        """Step ``batch`` on the thread; :meth:`take` hands it back once done."""
        if self._thread is None:
            self._tasks = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._run, args=(self._tasks, report),
                                            name="auturi own env share", daemon=True)
            self._thread.start()
        self.busy = True
        assert self._tasks is not None
        self._tasks.put((batch, t))

    def _run(self, tasks: queue.SimpleQueue, report: Callable[[], None]) -> None:
        while True:
            task = tasks.get()
            if task is None:
                return
            try:
                self.step(*task)
            except BaseException as e:  # handed to the loop, raised there (as a step in the loop would)
                self.error = e
            self._done.put(task[0])
            report()

    def has_done(self) -> bool:
        return bool(self._waited) or not self._done.empty()

    def take(self) -> list[np.ndarray]:
        """The tasks the thread finished since the last take; raises what a step raised."""
        out, self._waited = self._waited, []
        while not self._done.empty():
            out.append(self._done.get())
        if self.error is not None:
            raise self.error
        self.busy = False
        return out

    def wait(self) -> None:
        """Block until the thread's task is done (when nothing else is in flight)."""
        self._waited.append(self._done.get())

    def stop(self, clean: bool) -> None:
        """End the thread: at once after a collect (it is idle); after an error, waiting a
        second at most for a step it may be stuck in (a daemon thread, left behind)."""
        if self._thread is None:
            return
        assert self._tasks is not None
        self._tasks.put(None)
        self._thread.join(None if clean else 1.0)
        self._thread = self._tasks = None
        self.busy, self.error, self._waited, self._done = False, None, [], queue.SimpleQueue()


class ActorLoop:
    """Schedules one actor's envs over its lanes.

    ``wait`` blocks until at least one remote lane has finished and returns those lanes
    (it raises :class:`auturi.WorkerError` on a failure); it is only called while some
    remote lane is busy. ``row_group(remote_env_lanes)`` (needed when there are remote env
    lanes) makes the object the lockstep loop posts a row to and awaits (``step_row(t)``,
    ``wait()``, and ``settle()`` after the last row).

    ``lockstep`` (``ActorPlan.lockstep``) picks the row-by-row loop over the general one;
    ``overlap`` (``ActorPlan.overlap``) the overlapped loop, which needs
    ``task_queues(remote_env_lanes, remote_policy_lanes)`` (shm: ``TaskQueues``); without
    remote env lanes (the serial backend) there is nothing to overlap and the general loop runs.

    ``beat`` (an int64 memoryview and an index) is bumped once per row (lockstep) or per wait:
    whoever waits for this actor reads it to tell a busy actor from a stuck one (``shm``'s
    ``Waiter``); one integer store, no clock.
    """

    def __init__(self, env_ids: Sequence[int], env_lanes: list[Lane], policy_lanes: list[Lane],
                 batch_size: int, wait: Callable[[], list[Lane]], row_group: Callable[[list], Any] | None = None,
                 beat: tuple[Any, int] | None = None, lockstep: bool = False, overlap: bool = False,
                 task_queues: Callable[[list, list], Any] | None = None):
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
        self._queues = None
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
        elif overlap and any(lane.remote for lane in env_lanes):
            if task_queues is None:
                raise ValueError("the overlapped loop needs task_queues to queue tasks on remote lanes")
            self._queues = task_queues([lane for lane in env_lanes if lane.remote],
                                       [lane for lane in policy_lanes if lane.remote])
            self._own = _OwnShare(env_lanes, self.per_lane, self.env_ids)
            D, m = len(env_lanes), self.per_lane
            # Batches round-robin over the shares: the first batch takes each share's first
            # env, and so on, so a worker's envs land in different batches and one of them
            # steps while another is in inference (Sample Factory's two halves per worker).
            self._order = np.arange(D * m, dtype=np.int64).reshape(D, m).T.ravel()
            remote_of = np.cumsum([lane.remote for lane in env_lanes]) - 1  # share -> its remote lane
            remote_of[[not lane.remote for lane in env_lanes]] = -1
            self._lane_of = np.repeat(remote_of, m)  # env -> its remote env lane, -1: stepped here
            self._pol_remote = []  # policy lane -> its index among remote policy lanes, or -1
            self._pol_of_remote = []  # the inverse
            for p, lane in enumerate(policy_lanes):
                self._pol_remote.append(len(self._pol_of_remote) if lane.remote else -1)
                if lane.remote:
                    self._pol_of_remote.append(p)

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

    def _overlapped(self, num_steps: int) -> None:
        """The overlapped loop (see the module docstring). Each scheduling round: hand full
        batches (or a smaller one when the envs stepping now could not fill it) to free policy
        lanes, the envs furthest behind first and spread over the shares (:func:`pick_batch`,
        :func:`spread_batch`: round-robin at first); queue each acted env on its env lane at once; see
        what the lanes reported; step this process's own share (the actor steps share 0 itself)
        when that delays no batch; and only with nothing left to do, block for a report.

        Bookkeeping is per env on arrays: ``need[i]`` is the ``seq`` env ``i``'s lane shows
        once its queued step is done, so one compare over the envs in flight finds every step
        that finished, whatever the number of lanes."""
        q = self._queues
        n, B = len(self.env_ids), self.batch_size
        ids, per_lane = self.env_ids, self.per_lane
        lane_of = self._lane_of  # env -> its remote env lane, -1: this process's own share
        pol_remote, pol_of_remote = self._pol_remote, self._pol_of_remote
        pol_lanes = self.policy_lanes
        own_share = self._own
        num_env_lanes = q.num_env
        t = np.zeros(n, dtype=np.int64)
        need = np.zeros(n, dtype=np.int64)
        flying = np.zeros(n, dtype=bool)  # queued on a remote env lane, not seen done yet
        ready = _Queue()
        ready.push(self._order)
        # a batch takes this many envs of each share while others have some (spread_batch): a
        # share's envs spread over the batches as in the round-robin start; none when no share
        # holds more than that
        quota = -(-per_lane * B // n)
        own = _Queue()  # acted envs of the shares this process steps
        pol_busy: dict[int, tuple[np.ndarray, int]] = {}  # policy lane -> (its envs, seq when done)
        free_pol = list(range(len(pol_lanes)))[::-1]  # pop() takes lane 0 first
        in_env = 0  # envs acted for and not stepped yet
        finished = 0
        beats, k_beat = self.beat
        now = time.perf_counter
        waited = 0.0
        seen = np.zeros(0, np.int64)  # seq at the last look (set at q.begin())

        def take(k: int) -> np.ndarray:
            waiting = ready.pop(ready.size)
            batch, rest = pick_batch(waiting, t[waiting], k, per_lane, quota)
            ready.push(rest)
            return batch

        def route(batch: np.ndarray) -> None:
            nonlocal in_env
            in_env += len(batch)
            lanes = lane_of[batch]
            mine = lanes < 0
            if mine.any():
                own.push(batch[mine])
                batch, lanes = batch[~mine], lanes[~mine]
            if len(batch):
                need[batch] = q.post(lanes, t[batch], ids[batch])
                flying[batch] = True

        def stepped(batch: np.ndarray) -> None:
            nonlocal in_env, finished
            in_env -= len(batch)
            t[batch] += 1
            alive = batch[t[batch] < num_steps]
            finished += len(batch) - len(alive)
            ready.push(alive)

        def look() -> bool:
            """Handle what the lanes reported since the last look; whether anything was."""
            nonlocal seen
            got = own_share.has_done()
            if got:  # stepped on the own share's thread
                for batch in own_share.take():
                    stepped(batch)
            seq = q.seq()
            if (seq == seen).all():
                return got
            seen = seq
            for p in [p for p, (_, done_at) in pol_busy.items() if seq[num_env_lanes + pol_remote[p]] >= done_at]:
                route(pol_busy.pop(p)[0])  # acted: queue the steps first
                free_pol.append(p)
            if flying.any():
                idx = np.flatnonzero(flying)
                done = idx[seq[lane_of[idx]] >= need[idx]]
                if len(done):
                    flying[done] = False
                    stepped(done)
            return True

        submitted = deferred = 0  # batches handed to policy lanes; that count when own steps were put off

        def batch_due() -> bool:
            """Whether the envs env workers are stepping now (each lane's first queued post)
            would complete a batch for a free policy lane. Own steps are put off for one
            batch at most: once a batch went, they step, so this share never falls behind."""
            nonlocal deferred
            if (deferred and deferred != submitted + 1) or not free_pol or not flying.any():
                deferred = 0
                return False
            idx = np.flatnonzero(flying)
            coming = (need[idx] == seen[lane_of[idx]] + 1) & (t[idx] + 1 < num_steps)  # and not finishing
            if ready.size + int(coming.sum()) < B:
                return False
            deferred = submitted + 1
            return True

        q.begin()
        seen = q.base
        clean = False
        try:
            while finished < n:
                beats[k_beat] += 1  # a scheduling round: progress, for whoever waits for this actor
                # Full batches; a smaller one once the envs stepping now could not fill it
                # (the end of a collect, the envs behind a straggler): waiting would only hold
                # the ready envs back by a step while a replica idles.
                while free_pol and ready.size and (ready.size >= B or ready.size + in_env < B):
                    p = free_pol.pop()
                    batch = take(B)
                    submitted += 1
                    j = pol_remote[p]
                    if j >= 0:
                        pol_busy[p] = (batch, q.submit(j, t[batch], ids[batch]))
                    else:  # in this process: acts now
                        pol_lanes[p].submit(t[batch], ids[batch])
                        free_pol.append(p)
                        route(batch)
                if look():
                    continue
                # This process's own share steps best while inference runs: when the envs
                # env workers are stepping now would complete a batch, await them first, so
                # that batch goes to inference before this process spends an env step.
                if own.size and not own_share.busy:
                    if own_share.threaded():  # every acted env of the share, stepped meanwhile
                        own_share.start(own.pop(own.size), t, q.local_report)
                        continue
                    if not batch_due():
                        batch = own.pop_part()  # one batch's envs at a time
                        own_share.step(batch, t)
                        stepped(batch)
                        continue
                t0 = now()
                if flying.any() or pol_busy:
                    q.wait()  # a lane reports, or the own share's thread does
                else:
                    own_share.wait()  # only the thread is at work (and a stuck step there stops the beat)
                waited += now() - t0
            clean = True
        finally:
            self.wait_seconds += waited
            own_share.stop(clean)
        q.settle()

    def run(self, num_steps: int) -> None:
        if self._lockstep is not None:
            return self._lockstep(num_steps)
        if self._queues is not None:
            return self._overlapped(num_steps)
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
