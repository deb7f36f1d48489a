"""The ``shm`` backend: actors, env workers and policy replicas as processes on one machine,
all bulk data in shared memory, all waits blocking on semaphores.

Process layout for a config (the caller's process is "main"):
- ``num_actors == 1``: the actor runs in main; ``num_actors > 1``: one process per actor.
- ``env_parallel_degree = d``: the envs are split in ``d`` equal shares; the actor's process
  steps the first share itself and ``d - 1`` env worker processes step the others.
- ``policies_per_actor > 1``: that many replica processes per actor; 1: inference runs in
  the actor's process.
Main creates every process and every shared block, so it alone ends and unlinks them.
Over 400 lines: the executor's start-up, collect, fault checks and ordered shutdown share
its slot bookkeeping, and splitting them would spread one lifecycle over modules.
Workers start through ``forkserver`` (``AUTURI_START_METHOD`` may say ``spawn``): never
``fork``, which breaks CUDA and copies the caller's threads.
"""
from __future__ import annotations

import atexit
import multiprocessing as mp
import multiprocessing.connection
import multiprocessing.spawn as mp_spawn
import os
import signal
import sys
import threading
import time
import weakref
from typing import Any

import cloudpickle
import numpy as np

from auturi.config import Config
from auturi.errors import WorkerError
from auturi.executor.base import Executor
from auturi.executor.buffers import ArrayBlock, WeightsBlock
from auturi.executor.shm.channel import (BEAT, CLOSING, EXIT, FLUSH, OK, POLL_SECONDS, SPIN_SECONDS,
                                         START_TIMEOUT_FLOOR, TASK, RemoteLane, Semaphore, Waiter,
                                         control_specs, process_state, read_error, stuck_error, write_name)
from auturi.executor.shm.worker import ActorHost, worker_main

_PRELOAD = ["auturi.executor.shm.preload"]
JOIN_SECONDS = 2.0


def get_context(start_method: str | None = None) -> mp.context.BaseContext:
    method = start_method or os.environ.get("AUTURI_START_METHOD", "forkserver")
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"start method {method!r} is not supported: use 'forkserver' or 'spawn' "
                         f"('fork' breaks CUDA and copies the caller's threads)")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)
    return ctx


_starting = threading.local()


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


_stdlib_preparation_data = mp_spawn.get_preparation_data
mp_spawn.get_preparation_data = _preparation_data  # popen_forkserver/popen_spawn_posix look it up per call


def _start_without_main(proc: Any) -> None:
    _starting.ours = True
    try:
        proc.start()
    finally:
        _starting.ours = False


def _wait_exits(procs: list, timeout: float | None) -> None:
    """Wait until every process of ``procs`` has exited, or ``timeout`` seconds in all."""
    end = None if timeout is None else time.monotonic() + timeout
    pending = {p.sentinel for p in procs}
    while pending:
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            return
        pending -= set(multiprocessing.connection.wait(list(pending), left))


def _usable_cores_set() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def _usable_cores() -> int:
    return len(_usable_cores_set())


def _sigterm_exits() -> None:
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


class _Slot:
    def __init__(self, kind: str, name: str, start_sem: Any):
        self.kind, self.name, self.start_sem = kind, name, start_sem
        self.proc: Any = None
        self.conn: Any = None  # main's end of the pipe (env hosts send final observations)


class ShmExecutor(Executor):
    """Backend ``shm`` (see the module docstring).

    Args (besides the :class:`Executor` ones):
        start_method: ``"forkserver"`` (default) or ``"spawn"``.

    ``worker_timeout`` (see :class:`Executor`): every waiter (the caller, each actor) checks
    at its 0.1 s polls that the workers it waits for progressed; the innermost stuck process
    is the one named (an actor waiting on a stuck worker counts as alive). Start-up waits at
    least ``channel.START_TIMEOUT_FLOOR``. The caller's own thread (it steps the first actor's
    first env share) is not watched: nothing above it could report it.
    """

    backend = "shm"
    _shared_buffers = True

    def __init__(self, *args: Any, start_method: str | None = None, **kwargs: Any):
        self._ctx = get_context(start_method)
        self._sems: list[Semaphore] = []  # this layout's named semaphores (their names go after start-up)
        self._slots: list[_Slot] = []
        self._ctrl: ArrayBlock | None = None
        self._weights: ArrayBlock | None = None
        self._host: ActorHost | None = None
        self._actor_lanes: list[RemoteLane] = []
        self._main_waiter: Waiter | None = None
        self._generation = -1
        self._timing = np.zeros(3)
        self._payloads: tuple[bytes, bytes] = (b"", b"")
        self._torch_process: type | None = None
        self._preload: tuple[str, ...] = ()
        policy = args[1] if len(args) > 1 else kwargs.get("policy")
        if (self._ctx.get_start_method() == "forkserver" and "torch" in sys.modules
                and getattr(policy, "needs_torch", True)):
            from auturi.executor.shm.forkservers import TorchProcess, preload_key, start_torch_server

            self._torch_process = TorchProcess
            self._preload = preload_key(policy)
            start_torch_server(self._preload)  # it imports torch in the background while we probe and build
        _sigterm_exits()
        super().__init__(*args, **kwargs)
        ref = weakref.ref(self)
        atexit.register(lambda: (ref() is not None) and ref().close())  # type: ignore[union-attr]

    # ------------------------------------------------------------------ config
    def _apply_config(self, config: Config) -> None:
        self._close_workers()
        self._generation += 1
        if not self._payloads[0]:
            # Pickled apart: an env worker must not unpickle the policy (that would import
            # torch there), and a replica need not build env factories.
            self._payloads = (cloudpickle.dumps(self.env_fns), cloudpickle.dumps(self.policy))
        ctx = self._ctx
        slots: list[_Slot] = []
        actor_slots: list[int] = []
        if config.num_actors > 1:
            for a in range(config.num_actors):
                ids = config.actor_env_ids(a)
                actor_slots.append(len(slots))
                slots.append(_Slot("actor", f"actor {a} (envs {ids[0]}-{ids[-1]})", self._semaphore()))
        lanes: list[dict[str, list]] = []
        for a in range(config.num_actors):
            la: dict[str, list] = {"env": [], "policy": []}
            if config.env_parallel_degree > 1:
                k = config.envs_per_worker
                for w in range(1, config.env_parallel_degree):  # share 0 is the actor's
                    lo = config.actor_env_ids(a)[0] + w * k
                    s = _Slot("env", f"env worker {w} of actor {a} (envs {lo}-{lo + k - 1})", self._semaphore())
                    la["env"].append((len(slots), s.start_sem, s.name))
                    slots.append(s)
            if config.policies_per_actor > 1:
                ids = config.actor_env_ids(a)
                for r in range(config.policies_per_actor):
                    s = _Slot("policy", f"policy replica {r} of actor {a} (envs {ids[0]}-{ids[-1]}) on "
                                        f"{config.policy_device}", self._semaphore())
                    la["policy"].append((len(slots), s.start_sem, s.name))
                    slots.append(s)
            lanes.append(la)
        self._slots = slots
        cap = config.envs_per_actor
        self._ctrl = ArrayBlock.create(control_specs(len(slots), cap), shared=True)
        self._ctrl["dumpfd"][:] = -1  # until each worker registers its stack dump
        self._write_header()
        if self._weights is None:
            state = self.policy.get_state()
            if state:
                self._weights = WeightsBlock.write(dict(state), None)
        if self._weights is not None:
            write_name(self._ctrl, 1, self._weights.name)
        self._ctrl["hdr"][2] = self._weights_version
        main_sem = self._semaphore()
        done_sems = [self._semaphore() for _ in range(config.num_actors)]
        threads = self._policy_threads(config)
        self._timing = np.zeros(3)

        def start(slot: int, kind: str, done_sem: Any, info: dict) -> None:
            s = slots[slot]
            child_conn = None
            if kind in ("env", "actor"):  # env hosts: an actor always steps its first share
                s.conn, child_conn = ctx.Pipe(duplex=False)
            runs_policy = kind == "policy" or (kind == "actor" and config.policies_per_actor == 1)
            proc_cls = self._torch_process if runs_policy and self._torch_process is not None else ctx.Process
            s.proc = proc_cls(
                target=worker_main, name=f"auturi: {s.name}", daemon=True,
                args=(kind, slot, self._ctrl.handle, s.start_sem, done_sem, main_sem, self._payloads,  # type: ignore[union-attr]
                      self.spec, self.num_envs, info, child_conn))
            if proc_cls is self._torch_process:
                s.proc.preload = self._preload  # type: ignore[attr-defined]
            _start_without_main(s.proc)
            self._ctrl["pid"][slot] = s.proc.pid  # type: ignore[index]  # named if it is stuck before it starts
            if child_conn is not None:
                child_conn.close()

        spin = self._spin_seconds(config)
        common = {"seed": self.seed, "generation": self._generation, "device": config.policy_device,
                  "threads": threads, "id_offset": self.env_id_offset, "spin": spin, "timeout": self.worker_timeout}
        cores = sorted(_usable_cores_set())
        for a, la in enumerate(lanes):
            k = config.envs_per_worker
            for w, (slot, _, _) in enumerate(la["env"], start=1):
                lo = config.actor_env_ids(a)[0] + w * k
                cpu = cores[(a + w) % len(cores)]  # the actor has cores[a]; its workers follow
                start(slot, "env", done_sems[a], {**common, "env_ids": list(range(lo, lo + k)), "cpus": {cpu}})
            for slot, _, _ in la["policy"]:
                start(slot, "policy", done_sems[a], common)
            if config.num_actors > 1:
                start(actor_slots[a], "actor", done_sems[a],
                      {**common, "cpus": {cores[a % len(cores)]}, "actor": a, "config": config, "lanes": la, "report_sem": main_sem})
        # Wait for every worker to report that it built its envs / policy.
        beat = (memoryview(self._ctrl["hdr"]), BEAT)
        waiter = self._main_waiter = Waiter(main_sem, self._ctrl, self._check_children, config,
                                            timeout=max(self.worker_timeout, START_TIMEOUT_FLOOR), beat=beat)
        waiter.kill_stuck = True
        waiter.wait_all([RemoteLane(i, self._ctrl, s.start_sem, s.name) for i, s in enumerate(slots)])
        waiter.timeout = self.worker_timeout
        self._unlink_semaphore_names()  # every worker has opened them
        if config.num_actors == 1:
            self._host = ActorHost(0, config, lambda: self.env_fns, lambda: self.policy, self.seed, self._generation,
                                   self._ctrl, lanes[0], done_sems[0], self._check_children, self.env_id_offset,
                                   spin, self.worker_timeout, beat)
            self._host.waiter.kill_stuck = True
            if config.env_parallel_degree > 1:
                self._host.pin_cpu = cores[0]
            if self._host.local_policy is not None:
                self.policy.to(config.policy_device)
                self._host.local_policy.weights_version = self._weights_version
            if self._block is not None:
                self._host.bind(self._block.arrays)
        else:
            self._actor_lanes = [RemoteLane(s, self._ctrl, slots[s].start_sem, slots[s].name, self._main_waiter)
                                 for s in actor_slots]

    def _semaphore(self) -> Semaphore:
        sem = Semaphore(self._ctx)
        self._sems.append(sem)
        return sem

    def _unlink_semaphore_names(self) -> None:
        """Remove this layout's semaphore names from /dev/shm: once every worker has opened
        them (they are opened by name when a worker unpickles its arguments), or at close.
        Deterministic, where multiprocessing waits for the garbage collector."""
        for sem in self._sems:
            sem.unlink_name()

    @staticmethod
    def _spin_seconds(config: Config) -> float:
        """How long workers and actors poll, yielding, before they block (channel.SPIN_SECONDS)."""
        return float(os.environ.get("AUTURI_SPIN_SECONDS", SPIN_SECONDS))

    def _policy_threads(self, config: Config) -> int:
        """Torch threads of each CPU replica: the cores env workers leave free, shared out."""
        if config.policy_device != "cpu":
            return 1
        env_procs = config.num_actors * (config.env_parallel_degree - 1)
        replicas = config.num_actors * config.policies_per_actor
        return max(1, (_usable_cores() - env_procs) // replicas)

    def _write_header(self) -> None:
        if self._ctrl is None or self._block is None:
            return
        write_name(self._ctrl, 0, self._block.name)
        self._ctrl["hdr"][1] = self._num_steps
        self._ctrl["hdr"][0] += 1

    def _on_new_block(self) -> None:
        self._write_header()
        if self._host is not None and self._block is not None:
            self._host.bind(self._block.arrays)

    # ------------------------------------------------------------------ collect
    def _run_actors(self, num_steps: int) -> tuple[float, float, float]:
        assert self._ctrl is not None
        if self._host is not None:
            self._host.collect(num_steps)
        else:
            assert self._main_waiter is not None
            for lane in self._actor_lanes:
                lane.command(TASK, num_steps)
            self._main_waiter.wait_all([])
        total = self._ctrl["timing"].sum(axis=0)
        if self._host is not None:
            total = total + np.array(self._host.seconds())
        delta, self._timing = total - self._timing, total
        return float(delta[0]), float(delta[1]), float(delta[2])

    def _gather_finals(self) -> dict:
        finals: dict = {}
        if self._host is not None:
            finals.update(self._host.local_envs.take_finals())
        assert self._ctrl is not None
        # Ask every worker holding final observations at once, then read each pipe: one
        # round trip per collect instead of one per worker in turn (with 16 workers whose
        # CartPoles all ended an episode, 15 sequential trips cost ~3 ms a collect).
        asked = [(i, s) for i, s in enumerate(self._slots) if s.conn is not None and self._ctrl["nfinal"][i] > 0]
        for i, s in asked:
            self._ctrl["cmd"][i] = FLUSH
            s.start_sem.release()
        for i, s in asked:
            t0 = time.monotonic()
            while not s.conn.poll(POLL_SECONDS):
                self._check_children()
                idle = time.monotonic() - t0
                if idle > self.worker_timeout:
                    raise stuck_error(self._ctrl, i, s.name, idle, self.worker_timeout, self._config, kill=True)
            finals.update(s.conn.recv())
        return finals

    def _publish_weights(self, state: dict[str, np.ndarray], version: int) -> None:
        if state:
            self._weights = WeightsBlock.write(state, self._weights)
        if self._ctrl is not None:
            if self._weights is not None:
                write_name(self._ctrl, 1, self._weights.name)
            self._ctrl["hdr"][2] = version
        if self._host is not None and self._host.local_policy is not None:
            self._host.local_policy.load(state, version)

    # ------------------------------------------------------------------ faults, close
    def _check_children(self) -> None:
        procs = {s.proc.sentinel: s for s in self._slots if s.proc is not None}
        if not procs:
            return
        dead = multiprocessing.connection.wait(list(procs), timeout=0)
        if dead:
            s = procs[dead[0]]  # type: ignore[index]
            s.proc.join(0.1)
            code = s.proc.exitcode
            if code is not None and code < 0:
                try:
                    reason = f"was killed by signal {signal.Signals(-code).name}"
                except ValueError:
                    reason = f"was killed by signal {-code}"
            else:
                reason = f"exited unexpectedly with code {code}"
            tb = ""
            if self._ctrl is not None:
                i = self._slots.index(s)
                if self._ctrl["status"][i] != OK:
                    tb = read_error(self._ctrl, i)
            raise WorkerError(s.name, reason, tb, self._config)

    def _close_workers(self) -> None:
        """End every worker (EXIT, then SIGTERM, then SIGKILL), then unlink the blocks.
        The unlinking runs whatever happened before it."""
        slots, self._slots = self._slots, []
        self._actor_lanes = []
        self._main_waiter = None  # drops the last references to this layout's semaphores
        try:
            if self._host is not None:
                host, self._host = self._host, None
                host.close()
            started = [s for s in slots if s.proc is not None and s.proc._popen is not None]
            if self._ctrl is not None:
                self._ctrl["hdr"][CLOSING] = 1
                for s in started:
                    if s.proc.is_alive():
                        self._ctrl["cmd"][slots.index(s)] = EXIT
                        s.start_sem.release()
                        if process_state(s.proc.pid) in ("T", "t"):  # stopped: let it run to take EXIT
                            os.kill(s.proc.pid, signal.SIGCONT)
            # One deadline for all rather than JOIN_SECONDS per process in turn: an actor busy
            # in a collect whose workers already left only ends by a signal, and with many
            # such processes the turns added up to minutes.
            for stop in (None, "terminate", "kill"):
                alive = [s for s in started if s.proc.is_alive()]
                if not alive:
                    break
                if stop is not None:
                    for s in alive:
                        getattr(s.proc, stop)()
                _wait_exits([s.proc for s in alive], None if stop == "kill" else JOIN_SECONDS)
            for s in started:
                s.proc.join()
                s.proc.close()
            for s in slots:
                if s.conn is not None:
                    s.conn.close()
        finally:
            self._unlink_semaphore_names()  # the processes have ended (or were never started)
            self._sems = []
            if self._ctrl is not None:
                self._ctrl.close()
                self._ctrl = None
            if self._closed and self._weights is not None:
                self._weights.close()
                self._weights = None
