"""Lanes that run in the calling process: the serial backend's only kind, and the shm
backend's when a knob is 1 (degree 1: envs step in the actor; 1 replica: inference in the actor);
and :class:`CallerWatchdog`, which holds ``worker_timeout`` for the work done in the caller's
own thread, where no other process is watching."""
from __future__ import annotations

import ctypes
import math
import signal
import sys
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from auturi.errors import TIMEOUT_FIX, WorkerError
from auturi.executor.env_runner import EnvRunner, env_call_frame, env_of_frame
from auturi.executor.policy_runner import PolicyRunner


class LocalEnvLane:
    remote = False

    def __init__(self, runner: EnvRunner, name: str = "local envs"):
        self.runner, self.name = runner, name

    def submit(self, ts: Sequence[int], ids: Sequence[int]) -> None:
        self.runner.step(ts, ids)


class LocalPolicyLane:
    remote = False

    def __init__(self, runner: PolicyRunner, name: str = "local policy"):
        self.runner, self.name = runner, name

    def submit(self, ts: Sequence[int], ids: Sequence[int]) -> None:
        self.runner.act(np.asarray(ts), np.asarray(ids))


# ---------------------------------------------------------------------------- the caller's watchdog
START_TIMEOUT_FLOOR = 60.0
"""The envs' first resets (a simulator's launch) are allowed ``max(worker_timeout, this)``, as
the ``shm`` backend allows its workers' start-up (``shm.channel.START_TIMEOUT_FLOOR``)."""

STUCK_SIGNAL = getattr(signal, "SIGRTMIN", signal.SIGUSR2) + (4 if hasattr(signal, "SIGRTMIN") else 0)
"""Sent to the caller's main thread to interrupt a stuck env: a real-time signal nobody else
sends (SIGUSR2 where there are none). Its handler is installed once per process and passes
every signal it did not expect on to the handler that was there before."""


class _Stuck(BaseException):
    """Raised into the collecting thread by its watchdog; a BaseException so that an env's
    ``except Exception`` does not swallow it. :meth:`CallerWatchdog.run` turns it into the
    :class:`WorkerError`."""


_SENT: dict[int, "CallerWatchdog"] = {}  # thread id -> the watchdog that signalled it
_PREVIOUS: list = []  # the handler STUCK_SIGNAL had before ours (ours is installed once per process)


def _on_stuck_signal(signum: int, frame: Any) -> None:
    dog = _SENT.pop(threading.get_ident(), None)
    if dog is not None:
        if dog._armed:  # still inside the watched call: interrupt it
            raise _Stuck()
        return  # the call returned meanwhile: run() raises the error itself
    prev = _PREVIOUS[0] if _PREVIOUS else signal.SIG_DFL
    if callable(prev):
        prev(signum, frame)
    elif prev == signal.SIG_DFL:  # what the signal would have done without us: end the process
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)


def _install_handler() -> None:
    """Install our STUCK_SIGNAL handler (main thread only, once per process)."""
    if _PREVIOUS or threading.current_thread() is not threading.main_thread():
        return
    try:
        _PREVIOUS.append(signal.signal(STUCK_SIGNAL, _on_stuck_signal))
    except (ValueError, OSError):  # not available here: the watchdog raises by SetAsyncExc instead
        pass


class CallerWatchdog:
    """Holds ``timeout`` (``worker_timeout``) for work run in the caller's own thread
    (:meth:`run`): the serial backend's collect (and the shm backend's actor when it runs in
    the caller, once that backend calls it).

    A daemon thread, started at the first :meth:`run`, looks every ``min(timeout / 4, 1)``
    seconds (a wake-up a second costs nothing measurable; arming and disarming a call are a
    few stores and an uncontended lock, and no step pays anything for the watch) at the watched
    thread's progress: ``progress()`` (the actor loops' beats, bumped per row) and which env
    reset or step is running (the frame of its checking stand-in: while it is the same frame
    object, the same call has not returned). When neither changed for ``timeout`` seconds, it
    prints a warning with the thread's Python stack to stderr, then interrupts the thread: the
    main thread by a signal whose handler raises (that also interrupts a blocking system call:
    a read, a sleep, a lock), another thread by ``PyThreadState_SetAsyncExc`` (raised at its
    next bytecode; a blocking call there is not interrupted). :meth:`run` then raises a
    :class:`WorkerError` naming the env, with that stack. The caller then closes the executor.

    What no watchdog inside the process can do: interrupt C code that never returns to Python
    (a simulator's endless loop; holding the GIL, it also keeps this thread from running, so not
    even the warning is printed). Envs that may do that belong in env workers
    (``env_parallel_degree`` > 1, or several actors), where ``worker_timeout`` ends the process.

    It holds no reference to the executor (``progress`` and ``config`` must not either), so an
    executor dropped without ``close()`` is still collected, and its ``close()`` ends the thread.
    """

    def __init__(self, timeout: float, progress: Callable[[], Any], where: str,
                 config: Callable[[], Any] = lambda: None):
        self.timeout, self.progress, self.where, self.config = timeout, progress, where, config
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._armed = False
        self._gen = 0  # bumped by every run(): the thread starts its clock anew
        self._limit = timeout
        self._target = 0  # the watched thread's id
        self._fired = False
        self._by_signal = False
        self.error: WorkerError | None = None

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        """``fn(*args)`` in this thread, watched: raises :class:`WorkerError` when it makes
        no progress for ``timeout`` (default: the watchdog's) seconds."""
        limit = self.timeout if timeout is None else timeout
        if limit == math.inf or self._stop.is_set():
            return fn(*args)
        if not _PREVIOUS:
            _install_handler()
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name=f"auturi watchdog ({self.where})", daemon=True)
            self._thread.start()
        self._limit, self._target = limit, threading.get_ident()
        self._gen += 1
        self._armed = True
        try:
            try:
                out = fn(*args)
            finally:
                fired = self._disarm()
        except _Stuck:
            self._disarm()
            assert self.error is not None
            raise self.error from None
        if fired:  # it fired as the call returned: it took longer than allowed all the same
            assert self.error is not None
            raise self.error
        return out

    def _disarm(self) -> bool:
        with self._lock:
            self._armed = False
            fired, self._fired = self._fired, False
            if fired and not self._by_signal:  # an exception not raised yet must not land after the call
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._target), None)
            return fired

    def close(self) -> None:
        """End the watching thread (idempotent)."""
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5.0)

    def _watch(self) -> None:
        last: tuple | None = None
        since = 0.0
        interval = min(self.timeout / 4, 1.0)
        while not self._stop.wait(interval):
            if not self._armed:
                last = None  # drop the frames held
                continue
            frame = sys._current_frames().get(self._target)
            now = time.monotonic()
            cur = (self._gen, self.progress(), env_call_frame(frame) or frame)
            if last is None or cur[0] != last[0] or cur[1] != last[1] or cur[2] is not last[2]:
                last, since = cur, now
            elif now - since > self._limit:
                self._fire(frame, now - since)
                last = None
            frame = cur = None

    def _fire(self, frame: Any, idle: float) -> None:
        with self._lock:
            if not self._armed or self._fired:
                return
            call = env_call_frame(frame)
            env = env_of_frame(call) if call is not None else None
            who = f"env {env}" if env is not None else "the collect"
            stack = format_stack(frame)
            reason = (f"made no progress for {idle:.1f} s; if its steps are this slow on purpose, raise "
                      f"worker_timeout (now {self._limit:g} s): {TIMEOUT_FIX}")
            self.error = WorkerError(f"{who} ({self.where})", reason, "", self.config(), stack)
            sys.stderr.write(
                f"auturi: {who} ({self.where}) {reason}.\n  Its Python stack (most recent call first):\n"
                + "".join(f"    {line}\n" for line in stack.splitlines())
                + "  Auturi interrupts it and raises WorkerError; an env stuck in C code that never returns to "
                  "Python cannot be interrupted (run such envs in env workers: Config(env_parallel_degree=...)).\n")
            sys.stderr.flush()
            self._fired = True
            self._by_signal = (self._target == threading.main_thread().ident
                               and signal.getsignal(STUCK_SIGNAL) is _on_stuck_signal)
            if self._by_signal:
                _SENT[self._target] = self
                signal.pthread_kill(self._target, STUCK_SIGNAL)
            else:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._target), ctypes.py_object(_Stuck))


def format_stack(frame: Any) -> str:
    """A thread's Python stack from its innermost ``frame``, most recent call first, in
    ``faulthandler``'s words (as the ``shm`` backend reports a stuck worker's)."""
    lines = []
    while frame is not None:
        lines.append(f'File "{frame.f_code.co_filename}", line {frame.f_lineno} in {frame.f_code.co_name}')
        frame = frame.f_back
    return "\n".join(lines)
