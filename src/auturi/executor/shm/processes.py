"""Starting and ending the ``shm`` backend's processes: the start method, starting a child
without the caller's ``__main__``, waiting for exits, the ordered end of a set of workers,
SIGTERM as a clean exit, and a worker's exit when its owner is gone, however the owner died.
Nothing here knows what a worker does (see ``executor.py``).

Nothing is patched when this module is imported: the hook that keeps ``__main__`` out of our
children is installed by the first :func:`start_without_main` (and only affects children
started through it)."""
from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import multiprocessing.spawn as mp_spawn
import os
import select
import signal
import threading
import time
from typing import Any

from auturi.executor.shm.channel import EXIT, process_state

JOIN_SECONDS = 2.0


def get_context(start_method: str | None = None) -> mp.context.BaseContext:
    method = start_method or os.environ.get("AUTURI_START_METHOD", "forkserver")
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"start method {method!r} is not supported: use 'forkserver' or 'spawn' "
                         f"('fork' breaks CUDA and copies the caller's threads)")
    # Under forkserver every process starts from one of Auturi's own servers
    # (forkservers.EnvProcess, TorchProcess); the standard forkserver's preload, which the
    # first starter in the process fixes for everyone, is left to its owner.
    return mp.get_context(method)


_starting = threading.local()
_stdlib_preparation_data = mp_spawn.get_preparation_data
_hook_lock = threading.Lock()


def _preparation_data(name: str) -> dict:
    """``multiprocessing.spawn.get_preparation_data``, less the caller's ``__main__`` for
    the processes Auturi starts (while ``_starting.ours`` is set in this thread).

    By default every forkserver or spawn child re-imports the caller's main module: a
    training script that imports torch or SB3 at the top made each env worker import them
    too (~0.7 s per worker here, so a reconfigure to 6 env workers took 4 s, and env
    workers carried torch). Our children need nothing from ``__main__``: env factories and
    policies travel cloudpickled (by value when defined there) and the entry point is
    ``worker.worker_main``. A side effect users will like: a script without an
    ``if __name__ == "__main__":`` guard no longer re-runs in every worker."""
    data = _stdlib_preparation_data(name)
    if getattr(_starting, "ours", False):
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


def install_main_filter() -> None:
    """Install :func:`_preparation_data` in ``multiprocessing.spawn`` (idempotent).
    ``popen_forkserver``/``popen_spawn_posix`` look the function up per call; processes
    started by anyone else are unaffected (the flag is set only by :func:`start_without_main`)."""
    with _hook_lock:
        if mp_spawn.get_preparation_data is not _preparation_data:
            mp_spawn.get_preparation_data = _preparation_data


def start_without_main(proc: Any) -> None:
    """``proc.start()`` without the caller's ``__main__`` in the child (see :func:`_preparation_data`)."""
    install_main_filter()
    _starting.ours = True
    try:
        proc.start()
    finally:
        _starting.ours = False


def wait_exits(procs: list, timeout: float | None) -> None:
    """Wait until every process of ``procs`` has exited, or ``timeout`` seconds in all."""
    end = None if timeout is None else time.monotonic() + timeout
    pending = {p.sentinel for p in procs}
    while pending:
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            return
        pending -= set(multiprocessing.connection.wait(list(pending), left))


class Slot:
    """One worker process of a layout: its kind and name, the semaphore that wakes it, the
    process, and main's end of its pipe (env hosts send final observations and envs on it)."""

    def __init__(self, kind: str, name: str, start_sem: Any):
        self.kind, self.name, self.start_sem = kind, name, start_sem
        self.proc: Any = None
        self.conn: Any = None

    @property
    def started(self) -> bool:
        return self.proc is not None and self.proc._popen is not None


def ask_exit(ctrl: Any, slots: dict[int, Slot]) -> None:
    """Send EXIT to the live processes of ``slots`` (index -> slot) without waiting for them."""
    if ctrl is None:
        return
    for i, s in slots.items():
        if s.started and s.proc.is_alive():
            ctrl["cmd"][i] = EXIT
            s.start_sem.release()
            if process_state(s.proc.pid) in ("T", "t"):  # stopped: let it run to take EXIT
                os.kill(s.proc.pid, signal.SIGCONT)


def end_slots(ctrl: Any, slots: dict[int, Slot]) -> None:
    """End the processes of ``slots`` (control-block index -> slot): EXIT, then SIGTERM, then
    SIGKILL, one deadline for all rather than ``JOIN_SECONDS`` per process in turn (an actor
    busy in a collect whose workers already left only ends by a signal, and with many such
    processes the turns added up to minutes); then close their pipes."""
    ask_exit(ctrl, slots)
    procs = [s.proc for s in slots.values() if s.started]
    for stop in (None, "terminate", "kill"):
        alive = [p for p in procs if p.is_alive()]
        if not alive:
            break
        if stop is not None:
            for p in alive:
                getattr(p, stop)()
        wait_exits(alive, None if stop == "kill" else JOIN_SECONDS)
    for p in procs:
        p.join()
        p.close()
    for s in slots.values():
        if s.conn is not None:
            s.conn.close()
            s.conn = None


def sigterm_exits() -> None:
    """Make SIGTERM raise SystemExit in the main thread when nobody else handles it.

    Python's default for SIGTERM is to die on the spot: no ``finally``, no ``atexit``, so
    every worker, the forkservers and the named semaphores outlived the caller (measured).
    As SystemExit it unwinds like Ctrl-C does: a collect in progress closes its executor,
    ``atexit`` closes the others, and the process still exits with status 143. A handler the
    user (or a framework) installed is left alone."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _raise_exit)
    except (ValueError, OSError):  # not settable here (embedded interpreters)
        pass


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


OWNER_GRACE_SECONDS = 1.0
"""How long a worker whose owner died may take to unwind (its ``finally`` blocks, its envs'
``close``) before it leaves by ``os._exit``: an env stuck in its step or close must not keep
it alive."""
OWNER_POLL_SECONDS = 0.5
"""Where ``os.pidfd_open`` is missing (not Linux, a kernel before 5.3, a seccomp filter), how
often the watch asks whether the owner still exists."""


def exit_with_owner(owner: int) -> bool:
    """End this worker once process ``owner`` (the caller that made its control block) has
    ended, however it ended; returns False when it has ended already (the caller then leaves).

    A worker's parent is a forkserver, not the owner, and the worker itself holds the write
    ends of its forkserver's pipe and of the resource tracker's: when the owner was SIGKILLed
    (the OOM killer, ``kill -9``, a scheduler's preemption) nothing ever told the workers, so
    they, the forkservers and the tracker lived on, and the owner's segments and named
    semaphores stayed in /dev/shm (2 actors x 4 envs, degree 2: 0 of 6-7 processes gone after
    60 s). Here a daemon thread blocks in ``poll`` on a pidfd of the owner (no CPU while it
    waits; readable once the owner has exited, also while it is an unreaped zombie), then
    sends SIGTERM to this process's main thread, which :func:`sigterm_exits` turns into
    ``SystemExit``: the worker unwinds from wherever it waits (semaphore waits and ``sleep``
    return on the signal) and closes its envs; after :data:`OWNER_GRACE_SECONDS` it leaves by
    ``os._exit``, whatever it is doing. Once every worker is gone, the forkservers see their
    pipe's end and exit, and the resource tracker, whose last holder is gone, unlinks what the
    owner registered and did not unlink (every segment and named semaphore Auturi makes).
    Measured (``python -m bench.owner_death``, 2 cores at load 4-7, 2026-11-26): workers gone
    0.01-0.08 s after the kill, /dev/shm clean 0.02-0.09 s, every process (torch's forkserver
    included) 0.03-0.22 s; before, none in 60 s. Where the owner
    shares an ancestor's tracker (it was itself started by ``multiprocessing``), the names stay
    until that tracker's last holder ends.

    A main thread that holds the GIL without ever releasing it (an env looping in C) keeps
    this thread from running; nothing short of a kernel signal would end such a worker."""
    if owner <= 0 or owner == os.getpid():
        return True
    try:
        fd: int | None = os.pidfd_open(owner)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfd here: poll instead
        fd = None
        if not _exists(owner):
            return False
    threading.Thread(target=_watch_owner, args=(owner, fd), name="auturi-owner-watch", daemon=True).start()
    return True


def _exists(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (polling fallback of the owner watch)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process now: ours is gone
        return False
    return process_state(pid) not in ("Z", "X")  # "" without /proc: os.kill said it exists


def _watch_owner(owner: int, fd: int | None) -> None:
    if fd is not None:
        poller = select.poll()  # not select(): no limit on the fd's number
        poller.register(fd, select.POLLIN)
        while not poller.poll():  # blocks until the owner is gone (an empty answer: woken for nothing)
            continue
    else:
        while _exists(owner):
            time.sleep(OWNER_POLL_SECONDS)
    try:
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)  # type: ignore[arg-type]
    except (ProcessLookupError, OSError):  # the main thread is already gone: the process is ending
        pass
    time.sleep(OWNER_GRACE_SECONDS)
    os._exit(128 + signal.SIGTERM)


def exit_reason(code: int | None) -> str:
    """How a worker ended, in words, from its exit code."""
    if code is not None and code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited unexpectedly with code {code}"
