"""The control plane of the ``shm`` backend: a control block in shared memory, one slot per
worker process, and semaphores to wake workers and to report back.

Why semaphores: a wake-up through a POSIX semaphore costs ~5 us and blocks in the kernel,
so a waiting process uses no CPU (the thesis' code spun, and collapsed ~700x when processes
outnumbered cores). Bulk data never crosses here: workers read and write the rollout
arrays in place; a slot carries only a command word and a list of ``(row, env)`` tasks.

Protocol for one task: the submitter writes ``tasks``/``ntask``/``cmd`` and releases the
slot's start semaphore; the worker does the work, sets ``status``, bumps ``seq`` and
releases the done semaphore of whoever waits for it. Semaphore operations are full memory
barriers, so the plain writes before them are visible after them.
"""
from __future__ import annotations

import os
import time
import traceback
from typing import Any, Callable

import numpy as np

from auturi.errors import WorkerError
from auturi.executor.buffers import ArrayBlock

# commands
TASK, RESET, FLUSH, EXIT, STEP_ROW = 1, 2, 3, 4, 5
# status
OK, ERROR = 0, 1
ERR_BYTES = 16384
NAME_BYTES = 128
POLL_SECONDS = 0.1  # how often a blocked waiter checks that its peers are alive
SPIN_SECONDS = 1e-3
"""How long a waiter (worker or actor) polls its semaphore before it blocks, giving its core
away (``sched_yield``) between polls. A blocked process costs a futex wake, and on a VM an
IPI to a halted vCPU, to resume: 0.1-2 ms here, more than a row of 64 CartPole envs; a poll
costs ~1 us and, because it yields, lets any process of the same core that has work run
first (the thesis' workers polled without yielding and collapsed ~700x once processes
outnumbered cores; with the yield, a bare prototype of 16 workers on 2 cores ran 1.6-2.5x
faster than blocking, and of 64 workers 1.4-1.7x). 1 ms covers a row of 64 cheap envs on 2
cores; shorter windows measured the same at 64 workers and slower at 16. Between collects
everyone blocks after it. ``AUTURI_SPIN_SECONDS`` overrides it (0: always block)."""

_yield = getattr(os, "sched_yield", lambda: None)


def acquire(sem: Any, spin: float, timeout: float) -> bool:
    """``sem.acquire(timeout=timeout)``, polling it for ``spin`` seconds first and yielding
    the core between polls."""
    if spin > 0.0:
        try_acquire = sem.acquire
        if try_acquire(False):
            return True
        now = time.perf_counter
        end = now() + spin
        while now() < end:
            _yield()
            if try_acquire(False):
                return True
    return sem.acquire(timeout=timeout)


def control_specs(num_slots: int, cap: int) -> list[tuple[str, tuple[int, ...], Any]]:
    W = max(num_slots, 1)
    return [
        ("hdr", (8,), np.int64),  # 0: data generation, 1: num_steps, 2: weights version, 3: closing
        ("names", (2, NAME_BYTES), np.uint8),  # 0: rollout block name, 1: weights block name
        ("cmd", (W,), np.int64),
        ("arg", (W,), np.int64),
        ("ntask", (W,), np.int64),
        ("seq", (W,), np.int64),
        ("status", (W,), np.int64),
        ("nfinal", (W,), np.int64),
        ("timing", (W, 3), np.float64),  # cumulative env, policy, wait seconds
        ("tasks", (W, max(cap, 1), 2), np.int64),
        ("err", (W, ERR_BYTES), np.uint8),
    ]


def write_name(ctrl: ArrayBlock, k: int, name: str) -> None:
    raw = name.encode()
    assert len(raw) < NAME_BYTES
    ctrl["names"][k] = 0
    ctrl["names"][k, : len(raw)] = np.frombuffer(raw, np.uint8)


def read_name(ctrl: ArrayBlock, k: int) -> str:
    return bytes(ctrl["names"][k]).rstrip(b"\0").decode()


def write_error(ctrl: ArrayBlock, slot: int, exc: BaseException) -> None:
    if isinstance(exc, WorkerError):  # an actor passing on its worker's failure: keep its origin
        text = f"@worker {exc.worker}\n@reason {exc.reason}\n{exc.traceback}"
    else:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    raw = text.encode(errors="replace")[-(ERR_BYTES - 1):]
    ctrl["err"][slot] = 0
    ctrl["err"][slot, : len(raw)] = np.frombuffer(raw, np.uint8)
    ctrl["status"][slot] = ERROR


def read_error(ctrl: ArrayBlock, slot: int) -> str:
    return bytes(ctrl["err"][slot]).rstrip(b"\0").decode(errors="replace")


def raise_worker_error(ctrl: ArrayBlock, slot: int, name: str, config: Any) -> None:
    """Raise the failure reported in ``slot``, naming the worker where it started."""
    text, reason = read_error(ctrl, slot), "raised an exception"
    if text.startswith("@worker "):
        head, _, text = text.partition("\n")
        name = head[len("@worker "):] + f" (via {name})"
        head, _, text = text.partition("\n")
        reason = head[len("@reason "):]
    raise WorkerError(name, reason, text, config)


class RemoteLane:
    """A worker process seen from the process that hands it tasks."""

    remote = True

    def __init__(self, slot: int, ctrl: ArrayBlock, start_sem: Any, name: str, waiter: "Waiter | None" = None):
        self.slot, self.ctrl, self.start_sem, self.name = slot, ctrl, start_sem, name
        self.waiter = waiter
        self.issued = 1  # every worker reports once when it has started (or failed to)

    def command(self, cmd: int, arg: int = 0) -> None:
        c = self.ctrl
        c["arg"][self.slot] = arg
        c["cmd"][self.slot] = cmd
        if cmd != FLUSH and cmd != EXIT:
            self.issued += 1
            if self.waiter is not None:
                self.waiter.expect(self)
        self.start_sem.release()

    def submit(self, ts: np.ndarray, ids: np.ndarray) -> None:
        c, s = self.ctrl, self.slot
        n = len(ids)
        c["tasks"][s, :n, 0] = ts
        c["tasks"][s, :n, 1] = ids
        c["ntask"][s] = n
        self.command(TASK)


class Waiter:
    """Blocks on one done-semaphore until lanes it expects finish; between polls it calls
    ``check_health`` (which raises if a peer died), so a dead worker never hangs us.

    Which lanes finished is found with one vectorised compare over the control block, so a
    wake-up costs the same with 2 or 64 busy workers."""

    def __init__(self, done_sem: Any, ctrl: ArrayBlock, check_health: Callable[[], None], config: Any = None,
                 spin: float = 0.0):
        self.done_sem, self.ctrl, self.check_health, self.config = done_sem, ctrl, check_health, config
        self.spin = spin
        n = len(ctrl["seq"])
        self._issued = np.zeros(n, np.int64)
        self._busy = np.zeros(n, bool)
        self._lanes: dict[int, RemoteLane] = {}

    def expect(self, lane: RemoteLane) -> None:
        self._issued[lane.slot] = lane.issued
        self._busy[lane.slot] = True
        self._lanes[lane.slot] = lane

    def _acquire(self) -> None:
        if acquire(self.done_sem, self.spin, POLL_SECONDS):
            return
        self.check_health()
        while not self.done_sem.acquire(timeout=POLL_SECONDS):
            self.check_health()

    def __call__(self) -> list[RemoteLane]:
        """Wait until at least one expected lane finished; return the finished lanes."""
        seq = self.ctrl["seq"]
        while True:
            self._acquire()
            done = np.flatnonzero(self._busy & (seq >= self._issued))
            if len(done):
                break
        for _ in range(len(done) - 1):  # each finished lane posted once; we took one post
            self._acquire()
        self._busy[done] = False
        status = self.ctrl["status"]
        for slot in done.tolist():
            if status[slot] == ERROR:
                raise_worker_error(self.ctrl, slot, self._lanes[slot].name, self.config)
        return [self._lanes[slot] for slot in done.tolist()]

    def wait_group(self, sel: "slice | np.ndarray", count: int) -> None:
        """Wait for one command given to each of the ``count`` lanes ``sel`` (a :class:`RowGroup`),
        and no other command in flight: each lane posts exactly once per command, so this is
        one semaphore take per lane and one vectorised status check, however many lanes."""
        if self.spin > 0.0:
            for _ in range(count):
                self._acquire()
        else:
            take = self.done_sem.acquire
            for _ in range(count):
                if not take(True, POLL_SECONDS):
                    self.check_health()
                    self._acquire()
        status = self.ctrl["status"][sel]
        if status.any():
            failed = np.arange(len(self._issued))[sel][status == ERROR]
            slot = int(failed[0])
            raise_worker_error(self.ctrl, slot, self._lanes[slot].name, self.config)

    def wait_all(self, lanes: list[RemoteLane]) -> None:
        for lane in lanes:
            self.expect(lane)
        while self._busy.any():
            self()


class RowGroup:
    """Env lanes that step one row together (the lockstep loop): the row number written by one
    store (a slice: an actor's env workers have consecutive slots), then one semaphore post
    each; and one wait for all (:meth:`Waiter.wait_group`). Per lane and row that leaves a
    semaphore post and take: per-lane Python here cost more than stepping a cheap env with 16
    workers. The command word is written on the first row only and the lanes' command counts
    are settled once, after the last row (:meth:`settle`)."""

    def __init__(self, lanes: list[RemoteLane], waiter: Waiter):
        self.lanes, self.waiter = lanes, waiter
        slots = np.array([lane.slot for lane in lanes], dtype=np.int64)
        s0 = int(slots[0])
        consecutive = bool((slots == np.arange(s0, s0 + len(lanes))).all())
        self.sel: slice | np.ndarray = slice(s0, s0 + len(lanes)) if consecutive else slots
        self.ctrl = lanes[0].ctrl
        self._arg = self.ctrl["arg"]
        self._posts = [lane.start_sem.release for lane in lanes]
        self.rows = 0  # rows posted since the last settle
        for lane in lanes:
            waiter._lanes[lane.slot] = lane
            waiter._issued[lane.slot] = lane.issued  # from here on both count up together

    def step_row(self, t: int) -> None:
        if not self.rows:
            self.ctrl["cmd"][self.sel] = STEP_ROW
        self._arg[self.sel] = t
        self.rows += 1
        for post in self._posts:
            post()

    def wait(self) -> None:
        self.waiter.wait_group(self.sel, len(self._posts))

    def settle(self) -> None:
        """After the last row: count the rows as commands each lane finished."""
        for lane in self.lanes:
            lane.issued += self.rows
        self.waiter._issued[self.sel] += self.rows
        self.rows = 0


CLOSING = 3  # hdr index: the caller is closing this layout


def parent_watch(ctrl: ArrayBlock | None = None) -> Callable[[], None]:
    """A health check for a worker: exit quietly once the process that made it is gone, or
    (given the control block) once the caller has started closing the layout; an actor
    waiting mid-collect for workers that already left learns it here, instead of by a
    signal after the caller's grace period."""
    ppid = os.getppid()
    hdr = None if ctrl is None else ctrl["hdr"]

    def check() -> None:
        if os.getppid() != ppid or (hdr is not None and hdr[CLOSING]):
            raise SystemExit(0)

    return check
