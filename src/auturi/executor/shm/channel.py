"""The control plane of the ``shm`` backend: a control block in shared memory, one slot per
worker process, and semaphores to wake workers and to report back.

Why semaphores: a wake-up through a POSIX semaphore costs ~5 us and blocks in the kernel,
so a waiting process uses no CPU (the thesis' code spun, and collapsed ~700x when processes
outnumbered cores). Bulk data never crosses here: workers read and write the rollout
arrays in place; a slot carries only a command word and a list of ``(row, env)`` tasks.

The module is over 400 lines because the waiter's failure detection (dead, stuck), the stack
dump it reads, the semaphores it waits on and the two ways an actor keeps several lanes busy
at once (:class:`RowGroup`, :class:`TaskQueues`) are one protocol, read together.

Protocol for one task: the submitter writes ``tasks``/``ntask``/``cmd`` and releases the
slot's start semaphore; the worker does the work, sets ``status``, bumps ``seq`` and
releases the done semaphore of whoever waits for it. Semaphore operations are full memory
barriers, so the plain writes before them are visible after them.
"""
from __future__ import annotations

import math
import multiprocessing.synchronize as mp_sync
import multiprocessing.util as mp_util
import os
import signal
import time
import traceback
from typing import Any, Callable

import numpy as np

from auturi.errors import TIMEOUT_FIX, WorkerError
from auturi.executor.buffers import ArrayBlock

# commands (EXPORT: an env host ending in a reconfigure sends its live envs on its pipe;
# THREADS: a kept replica sets ``arg`` torch threads; REPLAN: a kept actor reads its new
# plan from its pipe and rebuilds its loop; STEP_QUEUE: an env worker steps the tasks queued
# in its slot, one post at a time (TaskQueues); ENV_CALL: an env host reads a pickled
# EnvCall from its pipe, runs it on its envs and sends the pickled answer back, as EXPORT does)
TASK, RESET, FLUSH, EXIT, STEP_ROW, EXPORT, THREADS, REPLAN, STEP_QUEUE, ENV_CALL = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
# words of the control block's header (``hdr``)
DATA_GEN = 0  # bumped when the rollout block changes (its name and NUM_STEPS are new)
NUM_STEPS = 1  # rows of the current rollout block
WEIGHTS_VERSION = 2  # version of the weights published in the weights block
CLOSING = 3  # the caller is closing this layout
BEAT = 4  # the progress word of an actor running in the caller's process (see Waiter)
OWNER = 5  # the pid of the process that made the block: workers exit when it is gone (processes.exit_with_owner)
# status
OK, ERROR = 0, 1
ERR_BYTES = 16384
NAME_BYTES = 128
POLL_SECONDS = 0.1  # how often a blocked waiter checks that its peers are alive
START_TIMEOUT_FLOOR = 60.0
"""Start-up work is bounded by ``max(worker_timeout, START_TIMEOUT_FLOOR)``: building envs and
policies (a simulator's launch, torch's first import in the forkserver) and each env's first
reset (many simulators load their level or scene there). A short timeout meant for steps must
not fail a slow start."""
DUMP_SECONDS = 2.0  # longest wait for a stuck process's faulthandler dump
DUMP_SIGNAL = signal.SIGUSR1
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
        ("hdr", (8,), np.int64),  # DATA_GEN, NUM_STEPS, WEIGHTS_VERSION, CLOSING, BEAT, OWNER
        ("names", (2, NAME_BYTES), np.uint8),  # 0: rollout block name, 1: weights block name
        ("cmd", (W,), np.int64),
        ("arg", (W,), np.int64),
        ("ntask", (W,), np.int64),
        ("seq", (W,), np.int64),
        ("status", (W,), np.int64),
        ("nfinal", (W,), np.int64),
        # progress besides finished commands: an actor's rows, waits returned and polls while
        # waiting; every env host's envs, one by one (each reset or step that returns)
        ("beat", (W,), np.int64),
        ("starting", (W,), np.int64),  # 1 while the worker resets new envs for the first time (start-up work)
        ("pid", (W,), np.int64),
        ("dumpfd", (W,), np.int64),  # the fd faulthandler dumps the worker's stack to (DUMP_SIGNAL)
        ("timing", (W, 3), np.float64),  # cumulative env, policy, wait seconds
        # (row, env, count) per task; count is read only from the first entry of a post queued
        # by TaskQueues (its ring: a worker never has more than its envs queued, <= cap)
        ("tasks", (W, max(cap, 1), 3), np.int64),
        ("qpos", (W,), np.int64),  # where an env worker reads its next queued post (TaskQueues)
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
        stack = exc.stack.replace("\n", "\x1f")  # one line: the traceback follows it
        text = f"@worker {exc.worker}\n@reason {exc.reason}\n@stack {stack}\n{exc.traceback}"
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
    text, reason, stack = read_error(ctrl, slot), "raised an exception", ""
    if text.startswith("@worker "):
        head, _, text = text.partition("\n")
        name = head[len("@worker "):] + f" (via {name})"
        head, _, text = text.partition("\n")
        reason = head[len("@reason "):]
        head, _, text = text.partition("\n")
        stack = head[len("@stack "):].replace("\x1f", "\n")
    raise WorkerError(name, reason, text, config, stack)


class Semaphore(mp_sync.Semaphore):
    """A semaphore shared with worker processes, named ``/dev/shm/sem.auturi_<pid>_*`` after
    its creator (so a leak is traceable to a process, as segments are), whose name the creator
    unlinks deterministically with :meth:`unlink_name` (multiprocessing unlinks it only when
    the object is garbage collected: 2-5 names per executor outlived ``close()``).

    A process opens the semaphore by name when it unpickles its start arguments, so the name
    may go as soon as every worker reported it started. A worker that finds the name gone
    was started by a caller that is closing (Ctrl-C during a reconfigure): it leaves quietly
    instead of printing multiprocessing's ``FileNotFoundError`` traceback."""

    def __init__(self, ctx: Any):
        super().__init__(0, ctx=ctx)
        self._finalizer = _finalizer_of(self)

    @staticmethod
    def _make_name() -> str:
        return f"/auturi_{os.getpid()}_s{next(mp_sync.SemLock._rand)}"

    def __setstate__(self, state: Any) -> None:
        try:
            super().__setstate__(state)
        except FileNotFoundError:
            raise SystemExit(0) from None  # exits the child silently (the bootstrap catches Exception only)

    def unlink_name(self) -> None:
        """Remove the name from /dev/shm (idempotent); open handles keep working."""
        fin, self._finalizer = getattr(self, "_finalizer", None), None
        if fin is not None:
            fin()  # multiprocessing's own cleanup: sem_unlink and the resource tracker's unregister


def _finalizer_of(obj: Any) -> Any:
    """The ``multiprocessing.util.Finalize`` that unlinks ``obj``'s name when it is collected."""
    for fin in reversed(list(mp_util._finalizer_registry.values())):  # ours is the newest
        ref = getattr(fin, "_weakref", None)
        if ref is not None and ref() is obj:
            return fin
    return None


class RemoteLane:
    """A worker process seen from the process that hands it tasks."""

    remote = True

    def __init__(self, slot: int, ctrl: ArrayBlock, start_sem: Any, name: str, waiter: "Waiter | None" = None,
                 issued: int = 1):
        self.slot, self.ctrl, self.start_sem, self.name = slot, ctrl, start_sem, name
        self.waiter = waiter
        # commands it has reported: every worker reports once when it has started (or failed
        # to); a worker kept from an earlier layout has reported ``seq`` of them
        self.issued = issued

    def command(self, cmd: int, arg: int = 0) -> None:
        c = self.ctrl
        c["arg"][self.slot] = arg
        c["cmd"][self.slot] = cmd
        if cmd not in (FLUSH, EXIT, EXPORT, ENV_CALL):  # these answer on the pipe, not through seq
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
    ``check_health`` (which raises if a peer died), so a dead worker never hangs us, and
    looks for a stuck one: an expected lane whose progress (``seq`` plus ``beat``) has not
    moved for ``timeout`` seconds is a :class:`WorkerError` carrying its Python stack. Only
    lanes found unchanged at two checks ``timeout`` apart are stuck, so no clock is read on
    the fast path; health is also checked every ``POLL_SECONDS`` while waits succeed (a busy
    actor whose waits never time out still sees a dead replica).

    What ``timeout`` bounds is one env's silence, not a command's: an env host bumps its
    ``beat`` after each single env's reset or step returns (``EnvRunner.on_progress``), so a
    worker stepping 2 envs of 10 s each in one command is not stuck at a 12 s timeout. A lane
    whose ``starting`` word is set (its envs' first resets) is allowed
    ``max(timeout, START_TIMEOUT_FLOOR)``.

    ``beat`` (an int64 memoryview and an index) is this process's own progress word: a poll
    that times out bumps it, telling whoever waits for us that we are alive and waiting (our
    own check then names the stuck worker below us, not us).

    Which lanes finished is found with one vectorised compare over the control block, so a
    wake-up costs the same with 2 or 64 busy workers."""

    def __init__(self, done_sem: Any, ctrl: ArrayBlock, check_health: Callable[[], None], config: Any = None,
                 spin: float = 0.0, timeout: float = math.inf, beat: tuple[Any, int] | None = None):
        self.done_sem, self.ctrl, self.check_health, self.config = done_sem, ctrl, check_health, config
        self.spin = spin
        self.timeout = timeout
        self.beat = beat
        self.kill_stuck = False  # SIGKILL a stuck worker when found (only the process that ends the layout)
        n = len(ctrl["seq"])
        self._issued = np.zeros(n, np.int64)
        self._busy = np.zeros(n, bool)
        self._lanes: dict[int, RemoteLane] = {}
        self._seen = np.full(n, -1, np.int64)  # progress at the last check
        self._since = np.zeros(n)  # when it last changed
        self._checked = time.monotonic()
        self._group: tuple[Any, int] = (slice(0, 0), 0)  # the RowGroup being awaited: slots, rows posted
        # the TaskQueues being awaited: its slots and the reports each owes when all it was given is done
        self._owed: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        self._pending_fns = (self._pending_lanes, self._pending_group, self._pending_owed)
        self._status_words = memoryview(ctrl["status"])

    def expect(self, lane: RemoteLane) -> None:
        self._issued[lane.slot] = lane.issued
        self._busy[lane.slot] = True
        self._lanes[lane.slot] = lane

    def adopt(self, lanes: list[RemoteLane]) -> None:
        """Take ``lanes`` as this waiter's without expecting anything of them yet: from here
        on their command counts and the waiter's count up together (:class:`RowGroup`)."""
        for lane in lanes:
            self._lanes[lane.slot] = lane
            self._issued[lane.slot] = lane.issued

    def _pending_lanes(self) -> np.ndarray:
        return np.flatnonzero(self._busy & (self.ctrl["seq"] < self._issued))

    def _pending_group(self) -> np.ndarray:
        sel, rows = self._group
        slots = np.arange(len(self._issued))[sel]
        return slots[self.ctrl["seq"][sel] < self._issued[sel] + rows]

    def _pending_owed(self) -> np.ndarray:
        slots, owed = self._owed
        return slots[self.ctrl["seq"][slots] < owed]

    def _acquire(self, group: int = 0) -> None:
        if acquire(self.done_sem, self.spin, POLL_SECONDS):
            return
        self._health(group)
        while not self.done_sem.acquire(timeout=POLL_SECONDS):
            self._health(group)

    def _health(self, group: int) -> None:
        """Peers alive (``check_health``), and none of the lanes awaited stuck."""
        now = self._checked = time.monotonic()
        if self.beat is not None:
            self.beat[0][self.beat[1]] += 1
        self.check_health()
        if self.timeout == math.inf:
            return
        slots = self._pending_fns[group]()
        if not len(slots):
            return
        ctrl = self.ctrl
        progress = ctrl["seq"][slots] + ctrl["beat"][slots]
        moved = progress != self._seen[slots]
        self._seen[slots] = progress
        self._since[slots[moved]] = now
        idle = now - self._since[slots]
        limit = np.where(ctrl["starting"][slots] != 0, max(self.timeout, START_TIMEOUT_FLOOR), self.timeout)
        stuck = ~moved & (idle > limit)
        if stuck.any():
            k = int(np.flatnonzero(stuck)[0])
            slot = int(slots[k])
            lane = self._lanes.get(slot)
            raise stuck_error(ctrl, slot, lane.name if lane else f"worker {slot}", float(idle[k]),
                              self.timeout, self.config, self.kill_stuck, starting=bool(ctrl["starting"][slot]))

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
        if time.monotonic() - self._checked > POLL_SECONDS:  # waits that never time out check too
            self._health(0)
        return [self._lanes[slot] for slot in done.tolist()]

    def wait_group(self, sel: "slice | np.ndarray", count: int, rows: int = 0) -> None:
        """Wait for one command given to each of the ``count`` lanes ``sel`` (a :class:`RowGroup`
        that has posted ``rows`` rows since it settled), and no other command in flight: each
        lane posts exactly once per command, so this is one semaphore take per lane and one
        vectorised status check, however many lanes."""
        self._group = (sel, rows)
        take = self.done_sem.acquire
        if self.spin > 0.0:
            for _ in range(count):
                if not take(False):  # posted already (the usual case when this process stepped a share)
                    self._acquire(1)
        else:
            for _ in range(count):
                if not take(True, POLL_SECONDS):
                    self._health(1)
                    self._acquire(1)
        if count == 1:  # one lane: a word read, not a numpy reduction (~1 us a row)
            if self._status_words[sel.start] == OK:
                return
        elif isinstance(sel, slice):  # consecutive lanes: plain word reads, no numpy reduction (~2 us a row)
            if not any(self._status_words[sel]):
                return
        elif not self.ctrl["status"][sel].any():
            return
        status = self.ctrl["status"][sel]
        failed = np.arange(len(self._issued))[sel][status == ERROR]
        slot = int(failed[0])
        raise_worker_error(self.ctrl, slot, self._lanes[slot].name, self.config)

    def take_report(self, slots: np.ndarray, owed: np.ndarray) -> None:
        """Take one report off the semaphore (a :class:`TaskQueues` waiting for any of its
        lanes), blocking; while it blocks, the lanes ``slots`` whose ``seq`` is below ``owed``
        are the ones checked for being stuck."""
        self._owed = (slots, owed)
        self._acquire(2)
        if time.monotonic() - self._checked > POLL_SECONDS:  # waits that never time out check too
            self._health(2)

    def settle_rows(self, sel: "slice | np.ndarray", rows: int) -> None:
        """Count ``rows`` rows a :class:`RowGroup` posted to lanes ``sel`` as finished commands."""
        self._issued[sel] += rows

    def wait_all(self, lanes: list[RemoteLane]) -> None:
        for lane in lanes:
            self.expect(lane)
        while self._busy.any():
            self()


def stuck_error(ctrl: ArrayBlock, slot: int, name: str, idle: float, timeout: float, config: Any,
                kill: bool = False, starting: bool = False) -> WorkerError:
    """The :class:`WorkerError` for the worker of ``slot``, idle for ``idle`` seconds, with its
    stack; ``kill`` then SIGKILLs it (it would not honour EXIT, and the layout is ending).
    ``starting``: it was in its envs' first resets (allowed ``START_TIMEOUT_FLOOR`` at least)."""
    pid, fd = int(ctrl["pid"][slot]), int(ctrl["dumpfd"][slot])
    note, stack = process_stack(pid, fd)
    if starting:
        note = f" in its envs' first reset (start-up work, allowed at least {START_TIMEOUT_FLOOR:g} s){note}"
    if kill and pid > 0:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return WorkerError(name, stuck_reason(idle, note, pid, timeout), "", config, stack)


def stuck_reason(idle: float, note: str, pid: int, timeout: float) -> str:
    return (f"made no progress for {idle:.1f} s{note} (pid {pid}); if its steps are this slow on purpose, "
            f"raise worker_timeout (now {timeout:g} s): {TIMEOUT_FIX}")


def process_state(pid: int) -> str:
    """The state letter of ``/proc/<pid>/stat`` (``R``, ``S``, ``T`` stopped, ...), or ``""``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""


def process_stack(pid: int, fd: int) -> tuple[str, str]:
    """``(note, stack)`` of process ``pid``: its Python stack, dumped by ``faulthandler`` (which
    the worker registered on ``DUMP_SIGNAL``, writing to its file ``fd``), read through
    ``/proc/<pid>/fd`` (Linux). A stopped process cannot dump: the note says so."""
    state = process_state(pid) if pid > 0 else ""
    if state in ("T", "t"):
        return " and is stopped (SIGSTOP; SIGCONT would resume it)", ""
    if not state or state in ("Z", "X"):
        return " and has exited", ""
    if fd < 0:
        return " while starting", "(no stack: it had not yet registered its stack dump)"
    try:
        f = open(f"/proc/{pid}/fd/{fd}", "rb")
    except OSError:
        return "", "(its stack could not be read: no /proc/<pid>/fd here)"
    with f:
        start = size = os.fstat(f.fileno()).st_size  # earlier dumps
        os.kill(pid, DUMP_SIGNAL)
        deadline = time.monotonic() + DUMP_SECONDS
        while time.monotonic() < deadline:  # the dump is written by a signal handler: no completion event
            time.sleep(0.02)
            last, size = size, os.fstat(f.fileno()).st_size
            if size > start and size == last:
                break
        f.seek(start)
        return "", f.read().decode(errors="replace").strip() or "(it did not dump its stack in time)"


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
        # One lane: the row number by a word store (a numpy slice store is ~0.5 us more)
        self._arg, self._at = (memoryview(self.ctrl["arg"]), s0) if len(lanes) == 1 else (self.ctrl["arg"], self.sel)
        self._posts = [lane.start_sem.release for lane in lanes]
        self.rows = 0  # rows posted since the last settle
        waiter.adopt(lanes)

    def step_row(self, t: int) -> None:
        if not self.rows:
            self.ctrl["cmd"][self.sel] = STEP_ROW
        self._arg[self._at] = t
        self.rows += 1
        for post in self._posts:
            post()

    def wait(self) -> None:
        self.waiter.wait_group(self.sel, len(self._posts), self.rows)

    def settle(self) -> None:
        """After the last row: count the rows as commands each lane finished."""
        for lane in self.lanes:
            lane.issued += self.rows
        self.waiter.settle_rows(self.sel, self.rows)
        self.rows = 0


class TaskQueues:
    """Remote lanes that an actor keeps busy without awaiting each one (the overlapped loop,
    ``ActorPlan.overlap``): an env worker takes several tasks at once and steps them in the
    order posted, reporting each as soon as it is done, so one batch of its envs steps while
    another batch is in inference; a policy replica takes one task at a time, as always.

    An env worker's queue is a ring in its slot's ``tasks`` rows: a post writes its
    ``(row, env)`` entries at the actor's write position (its count in the first entry's third
    word) and releases the worker's start semaphore once; the worker (``STEP_QUEUE``) reads at
    ``qpos``, steps the post's envs, moves ``qpos`` on, bumps ``seq`` and posts the done
    semaphore. An env is queued at most once at a time, so a worker never holds more entries
    than it has envs: the ring (``cap`` >= every worker's envs) never overruns. ``qpos`` lives
    in the control block, so the actor and a worker agree on it whatever either did before
    (another loop, a reconfigure that kept the worker).

    What a post or task returns is the ``seq`` its lane will show once it is done: the loop
    compares those with :meth:`seq` (one vectorised gather) to see what finished, however many
    lanes. Every lane reports on the actor's one done semaphore, used here as an event counter:
    :meth:`wait` blocks for one more report and takes any others already posted, and
    :meth:`settle` takes the rest once everything posted is done, leaving the semaphore as it
    found it. A report seen in ``seq`` before its semaphore post was taken only makes a later
    :meth:`wait` return at once; the loop then looks again."""

    def __init__(self, env_lanes: list[RemoteLane], policy_lanes: list[RemoteLane], waiter: Waiter):
        self.env_lanes, self.policy_lanes, self.waiter = env_lanes, policy_lanes, waiter
        self.lanes = env_lanes + policy_lanes
        self.ctrl = self.lanes[0].ctrl
        self.slots = np.array([lane.slot for lane in self.lanes], dtype=np.int64)
        self.num_env = len(env_lanes)
        self.env_slots = self.slots[:self.num_env]
        self.ring = self.ctrl["tasks"].shape[1]
        self._posts = [lane.start_sem.release for lane in self.lanes]
        self._seq, self._status, self._tasks = self.ctrl["seq"], self.ctrl["status"], self.ctrl["tasks"]
        self.wpos = np.zeros(self.num_env, np.int64)
        self.base = self.owed = np.zeros(len(self.lanes), np.int64)
        self.taken = 0
        self.extra = 0  # reports posted by a thread of this process (local_report)
        self._take = waiter.done_sem.acquire
        waiter.adopt(self.lanes)

    def begin(self) -> None:
        """Before a collect's first post (every lane idle): where each worker reads next, and
        the reports so far."""
        c = self.ctrl
        self.wpos = c["qpos"][self.env_slots].copy()
        self.base = self._seq[self.slots].copy()
        self.owed = self.base.copy()
        self.taken = 0
        self.extra = 0
        c["cmd"][self.env_slots] = STEP_QUEUE  # read by a worker only after its next post

    def seq(self) -> np.ndarray:
        """Each lane's reports so far (env lanes first, then policy lanes); raises the
        :class:`WorkerError` of a lane that reported a failure."""
        seq = self._seq[self.slots]
        if self._status[self.slots].any():  # statuses are OK (0) until a failure is reported
            j = int(np.flatnonzero(self._status[self.slots] == ERROR)[0])
            raise_worker_error(self.ctrl, int(self.slots[j]), self.lanes[j].name, self.waiter.config)
        return seq

    def post(self, lanes: np.ndarray, ts: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Queue the steps of envs ``ids`` at rows ``ts`` on env lanes ``lanes`` (one per
        env); each lane's worker steps them after what it was given before, reporting once
        for them. Returns, per env, the ``seq`` of its lane once its step is done."""
        R, tasks = self.ring, self._tasks
        order = np.argsort(lanes, kind="stable")
        lanes, ts, ids = lanes[order], ts[order], ids[order]
        first = np.flatnonzero(np.r_[True, lanes[1:] != lanes[:-1]])
        counts = np.diff(np.r_[first, len(lanes)])
        used = lanes[first]
        rank = np.arange(len(lanes)) - np.repeat(first, counts)
        slots = self.env_slots[lanes]
        at = (self.wpos[lanes] + rank) % R
        tasks[slots, at, 0] = ts
        tasks[slots, at, 1] = ids
        tasks[self.env_slots[used], self.wpos[used], 2] = counts
        self.wpos[used] = (self.wpos[used] + counts) % R
        self.owed[used] += 1
        need = np.empty(len(order), np.int64)
        need[order] = self.owed[lanes]
        posts = self._posts
        for k in used.tolist():
            posts[k]()
        return need

    def submit(self, k: int, ts: np.ndarray, ids: np.ndarray) -> int:
        """Hand policy lane ``k`` (idle) the rows ``ts`` of envs ``ids`` to act for; returns
        the ``seq`` of that lane once it is done."""
        j = self.num_env + k
        s, n, c = int(self.slots[j]), len(ids), self.ctrl
        self._tasks[s, :n, 0] = ts
        self._tasks[s, :n, 1] = ids
        c["ntask"][s] = n
        c["cmd"][s] = TASK
        self.owed[j] += 1
        self._posts[j]()
        return int(self.owed[j])

    def wait(self) -> None:
        """Block until one more report is posted (it may be posted already), and take those
        posted meanwhile too: one look at ``seq`` then covers them all."""
        self.waiter.take_report(self.slots, self.owed)
        self.taken += 1
        take = self._take
        while take(False):
            self.taken += 1

    def local_report(self) -> None:
        """A report from this process's own thread (the overlapped loop's own env share done):
        posted on the same semaphore, so a :meth:`wait` for the lanes wakes for it too, and
        counted, so :meth:`settle` leaves the semaphore as it found it."""
        self.extra += 1
        self.waiter.done_sem.release()

    def settle(self) -> None:
        """After the collect, with every post reported: take the reports' semaphore posts
        not taken yet, and count the reports as commands each lane finished."""
        reports = self.owed - self.base
        for _ in range(int(reports.sum()) + self.extra - self.taken):
            self.waiter.take_report(self.slots, self.owed)
        for lane, r in zip(self.lanes, reports.tolist()):
            lane.issued += r
        self.waiter.adopt(self.lanes)
        self.base = self.owed.copy()
        self.taken = 0


def parent_watch(ctrl: ArrayBlock | None = None) -> Callable[[], None]:
    """A health check for a worker: exit quietly once the process that forked it (a
    forkserver; the caller under ``spawn``) is gone, or (given the control block) once the
    caller has started closing the layout; an actor waiting mid-collect for workers that
    already left learns it here, instead of by a signal after the caller's grace period. The
    caller's own death, however it died, is watched apart (``processes.exit_with_owner``)."""
    ppid = os.getppid()
    hdr = None if ctrl is None else ctrl["hdr"]

    def check() -> None:
        if os.getppid() != ppid or (hdr is not None and hdr[CLOSING]):
            raise SystemExit(0)

    return check
