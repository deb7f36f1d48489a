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
SPIN_SECONDS = 200e-6
"""How long a waiter (worker or actor) polls its semaphore before it blocks, when every process
of the layout has a core to itself. Blocking and being woken cost 0.1-2 ms on a VM whose idle
vCPU has halted, more than a step of 32 cheap envs; a short poll keeps the core awake between
the steps of a collect. With more processes than cores nobody spins (the thesis' spinning
workers collapsed there), and between collects everyone blocks after this long."""


def acquire(sem: Any, spin: float, timeout: float) -> bool:
    """``sem.acquire(timeout=timeout)``, polling it without blocking for ``spin`` seconds first."""
    if spin > 0.0:
        end = time.perf_counter() + spin
        try_acquire = sem.acquire
        while time.perf_counter() < end:
            if try_acquire(False):
                return True
    return sem.acquire(timeout=timeout)


def control_specs(num_slots: int, cap: int) -> list[tuple[str, tuple[int, ...], Any]]:
    W = max(num_slots, 1)
    return [
        ("hdr", (8,), np.int64),  # 0: data generation, 1: num_steps, 2: weights version
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

    def wait_group(self, slots: np.ndarray) -> None:
        """Wait for one command given to each lane of ``slots`` (a :class:`RowGroup`), and no
        other command in flight: each lane posts exactly once per command, so this is one
        semaphore take per lane and one vectorised status check, however many lanes."""
        for _ in range(len(slots)):
            self._acquire()
        self._busy[slots] = False
        failed = slots[self.ctrl["status"][slots] == ERROR]
        if len(failed):
            slot = int(failed[0])
            raise_worker_error(self.ctrl, slot, self._lanes[slot].name, self.config)

    def wait_all(self, lanes: list[RemoteLane]) -> None:
        for lane in lanes:
            self.expect(lane)
        while self._busy.any():
            self()


class RowGroup:
    """Env lanes that step one row together (the lockstep loop): the command words of all of
    them written by one vectorised store, then one semaphore post each; and one wait for all
    (:meth:`Waiter.wait_group`). Per lane and step this leaves a semaphore post and take:
    per-lane Python here cost more than stepping a cheap env with 16 workers."""

    def __init__(self, lanes: list[RemoteLane], waiter: Waiter):
        self.lanes, self.waiter = lanes, waiter
        self.slots = np.array([lane.slot for lane in lanes], dtype=np.int64)
        self.ctrl = lanes[0].ctrl
        self._posts = [lane.start_sem.release for lane in lanes]
        for lane in lanes:
            waiter._lanes[lane.slot] = lane
            waiter._issued[lane.slot] = lane.issued  # from here on both count up together

    def step_row(self, t: int) -> None:
        c, slots, w = self.ctrl, self.slots, self.waiter
        c["arg"][slots] = t
        c["cmd"][slots] = STEP_ROW
        for lane in self.lanes:
            lane.issued += 1
        w._issued[slots] += 1  # kept equal to each lane's `issued` (both start from expect())
        w._busy[slots] = True
        for post in self._posts:
            post()

    def wait(self) -> None:
        self.waiter.wait_group(self.slots)


def parent_watch() -> Callable[[], None]:
    """A health check for a worker: exit quietly once the process that made it is gone."""
    ppid = os.getppid()

    def check() -> None:
        if os.getppid() != ppid:
            raise SystemExit(0)

    return check
