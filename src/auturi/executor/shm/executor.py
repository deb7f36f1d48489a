"""The ``shm`` executor: the layout plan's processes on this machine, all bulk data in shared
memory, all waits blocking on semaphores (see the package docstring for the layout).

Over 500 lines: start-up, the plan diff applied to live processes on reconfigure, collect, fault
checks and the ordered shutdown share the worker table, the control block and the semaphores; the env moves (``_take_envs``, the pickle
helpers at the bottom) and the env calls (``_call_envs``, ``_refuse_lost_changes``, which read
the same table and plan diff) are the part to split out next.

A reconfigure applies the difference of the old and new plans (``LayoutPlan.diff``): env
workers and policy replicas whose role is unchanged (same envs, or same replica, device and
threads, for the same actor) stay alive with their envs mid-episode; processes of the new plan
with no such counterpart start, the others end. An env whose stepping process changes moves
with its state (a cloudpickle round trip of the live env, tried once on the probe env at start,
``Executor.envs_movable``), so its episode goes on; where that cannot be done it is recreated
with the next generation's seed and its episode is cut (row 0 starts a new one). A replica
whose torch thread count changes is kept and told its new count. An actor process is kept
when all its workers are (a batch change): it reads its new plan from its pipe and rebuilds
its loop; otherwise it restarts (its lanes are fixed at start) and its envs move too.
``last_reconfigure`` reports what was kept, started, ended, moved and recreated.

Env calls (``Executor.env_call``: ``env_method``, ``get_attr``, ``set_attr``) reach the envs
where they step: main's own runner directly, each env worker and actor process by ``ENV_CALL``
(request and answer pickled on its pipe). An env a call changed travels pickled when it moves,
also before its first reset (``env_calls.Unreset``: made anew, it would lose the change); a
move that would recreate it is refused (``auturi.errors.LostEnvChangesError``).
"""
from __future__ import annotations

import atexit
import multiprocessing.connection
import os
import sys
import threading
import time
import weakref
from typing import Any

import cloudpickle
import numpy as np

from auturi.config import Config
from auturi.errors import LostEnvChangesError, WorkerError
from auturi.executor.base import Executor, given_num_envs
from auturi.executor.buffers import ArrayBlock, WeightsBlock
from auturi.executor.env_calls import EnvCall, dumps_env, first_error, read_env_call_answer
from auturi.executor.env_runner import make_env_runner
from auturi.executor.layout import MAIN, LayoutPlan, ProcessPlan, plan_layout
from auturi.executor.local_lanes import CallerWatchdog
from auturi.executor.shm import processes
from auturi.executor.shm.channel import (BEAT, CLOSING, DATA_GEN, ENV_CALL, EXPORT, FLUSH, NUM_STEPS, OK, OWNER,
                                         POLL_SECONDS, REPLAN, SPIN_SECONDS, START_TIMEOUT_FLOOR, TASK, THREADS,
                                         WEIGHTS_VERSION, RemoteLane, Semaphore, Waiter, control_specs, read_error,
                                         stuck_error, write_name)
from auturi.executor.shm.processes import Slot, get_context
from auturi.executor.shm.worker import ActorHost, WorkerStart, worker_main

MIN_SLOTS = 64
"""Slots of a control block at least: later layouts reuse the block (and the processes on
it) while they fit; one that does not starts everything afresh on a bigger block."""


class ShmExecutor(Executor):
    """Backend ``shm`` (see the module docstring).

    Args (besides the :class:`Executor` ones):
        start_method: ``"forkserver"`` (default) or ``"spawn"``.
        defer_envs: the first layout's envs in this process are made at their first reset
            or env call instead of now (``EnvRunner``'s ``defer``), so envs a reconfigure
            moves before either are made only where they land. The faces set it where their
            online tuner's wrap-time look will move the start's envs to env workers.

    ``worker_timeout`` (see :class:`Executor`) bounds one env's silence: every waiter (the
    caller, each actor) checks at its 0.1 s polls that the workers it waits for progressed,
    where a worker progresses each time one of its envs' resets or steps returns (not only
    when its whole command is done: 2 envs x a 10 s reset are not stuck at a 12 s timeout),
    and an actor also while it waits. The innermost stuck process is the one named (an actor
    waiting on a stuck worker counts as alive). Start-up work (building envs and policies,
    each env's first reset) is allowed ``max(worker_timeout, channel.START_TIMEOUT_FLOOR)``.
    The caller's own thread (it steps the first actor's first env share) is not watched:
    nothing above it could report it.

    Workers leave on their own when the caller is gone, however it died (SIGKILL included),
    and its segments and named semaphores are unlinked then (``processes.exit_with_owner``).
    """

    backend = "shm"
    _shared_buffers = True

    def __init__(self, *args: Any, start_method: str | None = None, defer_envs: bool = False, **kwargs: Any):
        self._ctx = get_context(start_method)
        # The first layout's envs in this process are made at their first reset or env call
        # (EnvRunner's defer): a face whose online tuner will move them to env workers at its
        # wrap-time look (adapters.common.build_collector) never makes them here.
        self._defer_envs = bool(defer_envs)
        self._workers: dict[int, Slot] = {}  # control-block index -> live worker
        self._leaving: dict[int, Slot] = {}  # workers a reconfigure in progress is ending
        self._by_role: dict[tuple, int] = {}  # a live worker's role (_role) -> its index
        self._threads: dict[int, int | None] = {}  # a live replica's torch threads
        self._actor_workers: dict[int, list[int]] = {}  # a live actor process's workers' indices
        self._plan: LayoutPlan | None = None
        self._ctrl: ArrayBlock | None = None
        self._weights: ArrayBlock | None = None
        self._host: ActorHost | None = None
        self._watchdog: CallerWatchdog | None = None
        self._actor_lanes: list[RemoteLane] = []
        self._main_waiter: Waiter | None = None
        self._main_sem: Semaphore | None = None  # workers report start-up (and actors their collects) here
        self._done_sems: dict[int, Semaphore] = {}  # per actor index: its workers report here
        self._generation = -1
        self._caller_weights_version = 0  # the weights version the caller's own policy object holds
        self._timing = np.zeros(3)
        self._payloads: tuple[bytes, bytes] = (b"", b"")
        self._torch_process: type | None = None
        self._preload: tuple[str, ...] = ()
        self._warm: dict[str, threading.Event] = {}  # per server warm_start started ("env", "torch"): set once it serves
        policy = args[1] if len(args) > 1 else kwargs.get("policy")
        # Env workers fork from a server that imported what the env factories name (SB3's
        # Monitor: 1.4 s per worker start when each imported it itself); see EnvProcess.
        self._env_modules = _env_modules(args, kwargs) if self._ctx.get_start_method() == "forkserver" else ()
        env_modules = self._env_modules
        if (self._ctx.get_start_method() == "forkserver" and "torch" in sys.modules
                and getattr(policy, "needs_torch", True)):
            from auturi.executor.shm.forkservers import TorchProcess, preload_key, start_torch_server

            self._torch_process = TorchProcess
            self._preload = tuple(sorted(set(preload_key(policy)) | set(env_modules)))  # actors step envs too
            # Started early only where the first layout forks policy processes: an in-process
            # start (the online tuner's) would pay seconds of a core for a server it may never use.
            if _first_layout_forks_policy(args, kwargs):
                start_torch_server(self._preload)  # it imports torch in the background while we build
        processes.sigterm_exits()
        super().__init__(*args, **kwargs)
        ref = weakref.ref(self)
        atexit.register(lambda: (ref() is not None) and ref().close())  # type: ignore[union-attr]

    def warm_start(self, config: Config | None = None) -> None:
        """Start worker forkservers now, so their imports run in the background before a
        reconfigure needs a worker, not inside it; :attr:`warming` says when they serve. With
        ``config``, only the servers its layout forks from: env workers' (gymnasium, numpy and
        what the env factories name: a fraction of a second of a core without SB3) and, where
        it runs a policy in a process, the torch one (two seconds of a core); without, both.
        A trial of 8 env workers waited 1.6 s for a torch server it never used. The online
        tuner calls this before each reconfigure that starts processes; idempotent per server.
        A no-op under ``spawn``."""
        if self._ctx.get_start_method() != "forkserver":
            return
        from auturi.executor.shm.forkservers import start_env_server, start_torch_server

        for server in sorted(self._servers_for(config) - set(self._warm)):
            if server == "env":
                start_env_server(self._env_modules)  # launches the server and returns; it imports while we go on
            else:
                start_torch_server(self._preload)
            self._warm[server] = threading.Event()
            threading.Thread(target=self._watch_warm, args=(server,), daemon=True,
                             name=f"auturi-warm-start-{server}").start()

    def needs_warm_start(self, config: Config) -> bool:
        """Whether a reconfigure to ``config`` forks from a server :meth:`warm_start` has not
        started yet (its first process would wait for the server's imports)."""
        return self._cold_servers(config) > 0

    def _cold_servers(self, config: Config) -> int:  # Executor.move_cost
        if self._ctx.get_start_method() != "forkserver":
            return 0
        return len(self._servers_for(config) - set(self._warm))

    def _warm_for(self, config: Config) -> None:  # Executor.prepare
        self.warm_start(config)

    def _servers_for(self, config: Config | None) -> set[str]:
        """The forkservers the processes of ``config``'s layout (every one, for None) fork from:
        ``torch`` for those running a policy (when policies fork from it), ``env`` for the rest."""
        torch = self._torch_process is not None
        if config is None:
            return {"env", "torch"} if torch else {"env"}
        try:
            processes = plan_layout(config).processes
        except Exception:  # an invalid config: the reconfigure says why
            return set()
        return {"torch" if torch and p.device is not None else "env" for p in processes if p.kind != MAIN}

    def _watch_warm(self, server: str) -> None:
        from auturi.executor.shm.forkservers import wait_ready

        try:
            if server == "env":
                wait_ready(torch=False, env=True, env_extra=self._env_modules, timeout=WARM_TIMEOUT)
            else:
                wait_ready(torch=True, env=False, extra=self._preload, timeout=WARM_TIMEOUT)
        except Exception:  # a server that cannot fork: the next reconfigure says why
            pass
        finally:
            self._warm[server].set()

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Block until the servers :meth:`warm_start` started serve (True), or ``timeout``
        seconds pass (False). Returns True at once when nothing was started."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for event in list(self._warm.values()):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not event.wait(left):
                return False
        return True

    @property
    def warming(self) -> bool:
        """Whether the forkservers :meth:`warm_start` started are still importing. Their
        imports take seconds of a core: a collect timed meanwhile shares the cores with them
        and reads slow (on a 2-core machine the serial start layout read 40% slow), so the
        online tuner does not measure collects while this is True."""
        return any(not e.is_set() for e in list(self._warm.values()))

    @property
    def _slots(self) -> list[Slot]:
        """The live workers in control-block order (benches and tests read their pids)."""
        return [self._workers[i] for i in sorted(self._workers)]

    # ------------------------------------------------------------------ config
    def _apply_config(self, config: Config) -> None:
        new, old = plan_layout(config), self._plan
        self._applying = config
        if not self._payloads[0]:
            # Pickled apart: an env worker must not unpickle the policy (that would import
            # torch there), and a replica need not build env factories.
            self._payloads = (cloudpickle.dumps(self.env_fns), cloudpickle.dumps(self.policy))
        keep, ending, fits, reuse_main, to_main, in_place = self._moves(new)
        live = self._take_envs(ending, reuse_main, to_main)
        changed = set(range(self.num_envs)) - in_place if old is not None else set()
        # an env moves when it travels (pickled, or not reset yet) or stays in this process
        moved = {e for e in changed if e in live and live[e] != b"" and (self.envs_movable or e in to_main)}
        recreated = changed - moved
        _close_envs(v for e, v in live.items() if e not in moved)
        lost = sorted(recreated & self._touched)
        if lost:  # found only now (_refuse_lost_changes could not know): the executor closes
            _close_envs(v for e, v in live.items() if e in moved)
            raise LostEnvChangesError([e + self.env_id_offset for e in lost],
                                     "they could not be pickled when they had to move", intact=False)
        old_host, self._host = self._host, None
        for i in ending:  # from here on their exits are expected, not failures
            self._workers.pop(i)
        self._leaving = ending  # ended by close() too, should anything below fail
        if not fits:
            self._end(ending)
            self._close_control_block()
            self._new_control_block(config)
            ending = {}  # ended; their slots were the old block's, none is held on the new one
        else:
            processes.ask_exit(self._ctrl, ending)
        if old is None or (recreated and self._steps_done):
            self._generation += 1  # envs made from here on get new seeds (the first layout: generation 0)
        live = {e: v for e, v in live.items() if e in moved and v is not None}
        self._set_threads(new, keep)
        self._plan = new
        started = self._start(new, keep, live, set(ending))
        self._wait_started(started)
        self._replan_actors(new, keep)
        self._end(ending)
        self._leaving = {}
        self._make_host(new, old_host if reuse_main else None, live)
        if old_host is not None and not reuse_main:
            old_host.close()  # closes the envs it did not hand over
        # the baseline of the next collect's seconds: kept workers and a reused runner count on
        self._timing = self._ctrl["timing"].sum(axis=0) + (np.array(self._host.seconds()) if self._host else 0.0)  # type: ignore[index]
        before, after = (old.env_process(), new.env_process()) if old is not None else ({}, {})
        across = {e for e in moved if not before.get(e) == after.get(e) == MAIN}  # main to main is no move
        self._counts = {"kept": len(keep), "started": len(started), "ended": len(ending), "moved": len(across),
                        "recreated": len(recreated)}

    def _moves(self, new: LayoutPlan) -> tuple[dict[str, int], dict[int, Slot], bool, bool, set[int], set[int]]:
        """What a reconfigure to plan ``new`` keeps, read from the live workers (changes
        nothing): the kept workers (new process name -> index), the ending ones, whether the
        new processes fit beside the ending ones on the control block, whether main's env
        runner is reused, the envs main steps in ``new``, and the envs that stay where they are."""
        keep = self._kept(new)
        ending = {i: s for i, s in self._workers.items() if i not in keep.values()}
        # the ending workers' slots stay theirs until they have left (they leave while the new start)
        fits = self._ctrl is not None and len(new.processes) + len(ending) <= len(self._ctrl["seq"])
        if not fits:
            keep, ending = {}, dict(self._workers)
        reuse_main = (self._host is not None and new.main.actor is not None
                      and tuple(getattr(self._host.local_envs, "env_ids", ())) == new.main.env_ids)
        to_main = {e for e, proc in new.env_process().items() if proc == MAIN}
        in_place = {e for p in new.processes if p.name in keep for e in p.env_ids}
        in_place |= set(new.main.env_ids) if reuse_main else set()
        return keep, ending, fits, reuse_main, to_main, in_place

    def _refuse_lost_changes(self, config: Config) -> None:
        """Envs a call changed move only as pickles (or as objects within this process): when
        envs cannot be pickled (``envs_movable``), a reconfigure that takes such an env out of
        its process is refused before it starts. (One that fails to pickle only at the move
        is found then: :meth:`_apply_config` raises and the executor closes.)"""
        if self._plan is None:
            return
        # without envs_movable every changed env is made anew elsewhere; else those whose
        # pickle was found to drop a change (EnvRunner.travel_checks, after each env call)
        at_risk = self._touched if not self.envs_movable else self._touched & self._pinned
        if not at_risk:
            return
        _, _, _, _, to_main, in_place = self._moves(plan_layout(config))
        in_main = set(getattr(self._host.local_envs, "env_ids", ())) if self._host is not None else set()
        lost = sorted(e for e in at_risk if e not in in_place and not (e in in_main and e in to_main))
        if lost:
            why = ("this env does not move with its state (tried on the probe env at start: it cannot be pickled, or "
                   "a copy steps differently, as gymnasium's MuJoCo and ALE envs whose pickle rebuilds them; "
                   "envs_movable is False), so it would be made anew in its new process" if not self.envs_movable else
                   "after the calls, a pickle round trip of the env did not keep them (it does not pickle, or its "
                   "pickle rebuilds it from its constructor's arguments, as gymnasium's MuJoCo envs and EzPickle "
                   "envs do: their state and changed attributes are lost on a move)")
            raise LostEnvChangesError([e + self.env_id_offset for e in lost], why)

    def _call_envs(self, call: EnvCall) -> dict[int, Any]:
        """The call goes to every process that steps one of ``call.ids``: each env worker and
        actor process reads it from its pipe (``ENV_CALL``) and answers there, all at once,
        while main runs it on its own runner; errors are raised once all have answered (the
        pipes stay in step). An interrupted or failed exchange closes the executor."""
        assert self._plan is not None
        wanted = set(call.ids)
        names = {p.name for p in self._plan.processes if p.kind in ("env", "actor") and wanted & set(p.env_ids)}
        asked = [(i, s) for i, s in sorted(self._workers.items()) if s.name in names and s.conn is not None]
        results: dict[int, Any] = {}
        errors: list[BaseException] = []
        request = cloudpickle.dumps(call)
        answered = False
        try:
            for i, s in asked:
                # the command first: the worker then reads the request at once (a request larger
                # than the pipe's buffer would block a send made before it)
                RemoteLane(i, self._ctrl, s.start_sem, s.name).command(ENV_CALL)  # type: ignore[arg-type]
                s.conn.send(request)
            local = self._host.local_envs if self._host is not None else None
            if local is not None and wanted & set(getattr(local, "env_ids", ())):
                try:
                    results.update(local.call(call))
                except Exception as e:  # raised once the workers have answered
                    errors.append(e)
                self._note_pinned(local.travel_checks)
            answers = [self._recv(i, s) for i, s in asked]
            answered = True
        finally:
            if not answered:
                self.close()  # a worker may still owe an answer on its pipe: not usable any more
        for answer in answers:
            try:
                got, checks = read_env_call_answer(answer)
            except Exception as e:
                errors.append(e)
                continue
            results.update(got)
            self._note_pinned(checks)
        if errors:
            raise first_error(call, errors, self.env_id_offset)
        return results

    def _note_pinned(self, checks: dict[int, bool]) -> None:
        """Record, from a runner's ``travel_checks`` after a call, which envs the call changed
        are pinned now: their pickle would drop a change (:meth:`_refuse_lost_changes`)."""
        for e, whole in checks.items():
            if whole:
                self._pinned.discard(e)
            else:
                self._pinned.add(e)

    def _kept(self, new: LayoutPlan) -> dict[str, int]:
        """New process name -> index of the live worker that keeps doing it: an env worker or
        replica whose role and actor are unchanged (it reports to its actor's semaphore).
        Unlike ``LayoutPlan.diff``, a replica's torch threads are not part of its role here: a
        kept replica is told its new count (:meth:`_set_threads`). An actor process is kept
        when, besides its role, its workers are all kept and are the ones it had (its lanes
        were handed to it at start); it is then given its new plan (:meth:`_replan_actors`)."""
        keep = {}
        for p in new.processes:
            i = self._by_role.get(_role(p))
            if i is not None and p.kind != "actor":
                keep[p.name] = i
        for ap in new.actors:
            i = self._by_role.get(_role(ap.processes[0])) if ap.processes and ap.processes[0].name == ap.host else None
            workers = [p.name for p in ap.processes if p.name != ap.host]
            if i is not None and all(w in keep for w in workers) and \
                    sorted(keep[w] for w in workers) == self._actor_workers.get(i):
                keep[ap.host] = i
        return keep

    def _replan_actors(self, plan: LayoutPlan, keep: dict[str, int]) -> None:
        """Give each kept actor process its new plan (a new batch size: its loop changes, its
        envs, policy and workers do not) and wait until all have rebuilt their loops."""
        assert self._ctrl is not None and self._main_waiter is not None
        for ap in plan.actors:
            i = keep.get(ap.host)
            if i is None:
                continue
            w = self._workers[i]
            w.conn.send((ap, plan.config))
            lane = RemoteLane(i, self._ctrl, w.start_sem, w.name, self._main_waiter, int(self._ctrl["seq"][i]))
            lane.command(REPLAN)
        self._main_waiter.wait_all([])

    def _set_threads(self, plan: LayoutPlan, keep: dict[str, int]) -> None:
        """Tell each kept replica whose torch thread count (or batch size) changes its new
        count, and wait."""
        assert self._ctrl is not None
        batch_changed = self._plan is not None and self._plan.config.policy_batch_size != plan.config.policy_batch_size
        for p in plan.processes:
            i = keep.get(p.name)
            if i is None or p.kind != "policy" or (p.threads == self._threads.get(i) and not batch_changed):
                continue  # a new batch size: the replica's thread rule chooses again too
            waiter = Waiter(self._done_sem(p.actor), self._ctrl, self._check_children, plan.config,  # type: ignore[arg-type]
                            timeout=self.worker_timeout)
            w = self._workers[i]
            RemoteLane(i, self._ctrl, w.start_sem, w.name, waiter, int(self._ctrl["seq"][i])).command(THREADS,
                                                                                                      p.threads or 0)
            waiter.wait_all([])
            self._threads[i] = p.threads

    def _take_envs(self, ending: dict[int, Slot], reuse_main: bool, to_main: set[int]) -> dict[int, Any]:
        """The envs of ending workers, and of main when its runner is not reused: env id ->
        the live env (from main), its pickle (from a worker), ``None`` (not reset yet: made
        anew with the same seed, the same data) or ``b""`` (could not be pickled). Workers
        send nothing when envs cannot be pickled (``envs_movable``)."""
        live: dict[int, Any] = {}
        asked = [(i, s) for i, s in ending.items() if s.conn is not None]
        for i, s in asked:
            RemoteLane(i, self._ctrl, s.start_sem, s.name).command(EXPORT, int(self.envs_movable))  # type: ignore[arg-type]
        for i, s in asked:
            live.update(self._recv(i, s))
        runner = self._host.local_envs if self._host is not None else None
        take = getattr(runner, "take_envs", None)
        if take is not None and not reuse_main:  # live objects: those staying here need no pickle
            ids = list(runner.env_ids)  # type: ignore[union-attr]
            live.update(dict.fromkeys(ids))  # not reset yet: None
            # pickled now for another process, so that one that cannot be is known as such
            live.update({e: env if e in to_main else _pickled(env) for e, env in take(ids).items()})
        return live

    def _new_control_block(self, config: Config) -> None:
        slots = max(MIN_SLOTS, 2 * config.num_processes)
        self._ctrl = ArrayBlock.create(control_specs(slots, self.num_envs), shared=True)
        self._ctrl["dumpfd"][:] = -1  # until each worker registers its stack dump
        self._ctrl["hdr"][OWNER] = os.getpid()  # workers leave when this process is gone, however it died
        self._write_header()
        if self._weights is None:
            state = self.policy.get_state()
            if state:
                self._weights = WeightsBlock.write(dict(state), None)
        if self._weights is not None:
            write_name(self._ctrl, 1, self._weights.name)
        self._ctrl["hdr"][WEIGHTS_VERSION] = self._weights_version
        self._main_sem = self._semaphore()

    def _semaphore(self) -> Semaphore:
        return Semaphore(self._ctx)

    def _done_sem(self, actor: int) -> Semaphore:
        """Actor ``actor``'s semaphore: its workers report there, whichever layout started them."""
        if actor not in self._done_sems:
            self._done_sems[actor] = self._semaphore()
        return self._done_sems[actor]

    @staticmethod
    def _spin_seconds() -> float:
        """How long workers and actors poll, yielding, before they block (channel.SPIN_SECONDS)."""
        return float(os.environ.get("AUTURI_SPIN_SECONDS", SPIN_SECONDS))

    def _worker_start(self, p: ProcessPlan, live: dict) -> WorkerStart:
        return WorkerStart(seed=self.seed, generation=self._generation, id_offset=self.env_id_offset,
                           spin=self._spin_seconds(), timeout=self.worker_timeout, check_finite=self.check_finite,
                           cpus=set(p.cpus or ()), device=p.device, threads=p.threads, env_ids=list(p.env_ids),
                           live={e: _pickled(live[e]) for e in p.env_ids if e in live})

    def _start(self, plan: LayoutPlan, keep: dict[str, int], live: dict[int, Any], leaving: set[int]) -> list[int]:
        """Start the plan's processes that no live worker keeps doing, on slots neither kept
        nor ``leaving``; returns their indices. Actors start last: their lanes name their
        workers' slots."""
        ctrl = self._ctrl
        assert ctrl is not None
        free = iter(sorted(set(range(len(ctrl["seq"]))) - set(keep.values()) - leaving))
        index = dict(keep)
        for p in plan.processes:
            if p.name not in index:
                index[p.name] = next(free)
        by_role = {}
        started = []
        for p in sorted(plan.processes, key=lambda q: q.kind == "actor"):
            i = index[p.name]
            by_role[_role(p)] = i
            self._threads[i] = p.threads
            if p.name in keep:
                self._workers[i].name = p.name
                continue
            self._start_one(i, p, plan, index, live)
            started.append(i)
        self._by_role = by_role
        return started

    def _process_class(self, runs_policy: bool) -> tuple[type, tuple[str, ...] | None]:
        """The process class a worker starts as, and the modules its server preloads (None:
        spawn): policy processes from the torch server, every other one (env workers, and
        actors and replicas of a policy without torch) from the env server for the
        factories' modules (:class:`EnvProcess`, never the standard forkserver, whose preload
        another library may have fixed first)."""
        if runs_policy and self._torch_process is not None:
            return self._torch_process, self._preload
        if self._ctx.get_start_method() == "forkserver":
            from auturi.executor.shm.forkservers import EnvProcess

            return EnvProcess, self._env_modules
        return self._ctx.Process, None

    def _start_one(self, i: int, p: ProcessPlan, plan: LayoutPlan, index: dict[str, int], live: dict) -> None:
        ctrl = self._ctrl
        assert ctrl is not None
        s = self._workers[i] = Slot(p.kind, p.name, self._semaphore())
        for k in ("seq", "status", "nfinal", "beat", "starting", "cmd", "arg", "pid"):
            ctrl[k][i] = 0
        ctrl["timing"][i] = 0
        ctrl["dumpfd"][i] = -1
        info = self._worker_start(p, live)
        if p.kind == "actor":
            ap = plan.actors[p.actor]  # type: ignore[index]
            info.plan, info.config, info.report_sem, info.lanes = ap, plan.config, self._main_sem, self._lanes(ap, index)
            self._actor_workers[i] = sorted(lane[0] for kind in ("env", "policy") for lane in info.lanes[kind])
        child_conn = None
        if p.kind in ("env", "actor"):  # env hosts: an actor always steps its first share
            # both ways: an actor reads its new plan from it (_replan_actors), every env host
            # the env calls it answers there (_call_envs, ENV_CALL)
            s.conn, child_conn = self._ctx.Pipe(duplex=True)
        runs_policy = p.device is not None
        proc_cls, preload = self._process_class(runs_policy)
        s.proc = proc_cls(target=worker_main, name=f"auturi: {s.name}", daemon=True,
                          args=(p.kind, i, ctrl.handle, s.start_sem, self._done_sem(p.actor), self._main_sem,
                                self._payloads, self.spec, self.num_envs, info, child_conn))
        if preload is not None:
            s.proc.preload = preload
        processes.start_without_main(s.proc)
        ctrl["pid"][i] = s.proc.pid  # named if it is stuck before it starts
        if self._ctx.get_start_method() == "forkserver":  # its server serves: no trial need wait for it
            self._warm.setdefault("torch" if runs_policy and self._torch_process is not None else "env", _SERVING)
        if child_conn is not None:
            child_conn.close()

    def _lanes(self, ap: Any, index: dict[str, int]) -> dict[str, list]:
        """The remote lanes of actor ``ap``: ``(slot, start_sem, name, commands reported)``."""
        assert self._ctrl is not None
        seq = self._ctrl["seq"]
        out: dict[str, list] = {"env": [], "policy": []}
        names = [("env", sh.process) for sh in ap.env_shares[1:]]
        names += [("policy", r.process) for r in ap.replicas if r.process != ap.host]
        for kind, name in names:
            i = index[name]
            # a new worker reports once when started; a kept one has reported seq[i] commands
            out[kind].append((i, self._workers[i].start_sem, name, max(1, int(seq[i]))))
        return out

    def _wait_started(self, started: list[int]) -> None:
        """Wait for every new worker to report that it built its envs / policy."""
        assert self._ctrl is not None
        beat = (memoryview(self._ctrl["hdr"]), BEAT)
        waiter = self._main_waiter = Waiter(self._main_sem, self._ctrl, self._check_children, self._applying,
                                            timeout=max(self.worker_timeout, START_TIMEOUT_FLOOR), beat=beat)
        waiter.kill_stuck = True
        waiter.wait_all([RemoteLane(i, self._ctrl, self._workers[i].start_sem, self._workers[i].name) for i in started])
        waiter.timeout = self.worker_timeout

    def _make_host(self, plan: LayoutPlan, reused: ActorHost | None, live: dict[int, Any]) -> None:
        """Main's part: the actor it hosts (one actor: its loop, share 0 and maybe its
        policy run here), else the lanes of the actor processes."""
        ctrl = self._ctrl
        assert ctrl is not None
        defer, self._defer_envs = self._defer_envs, False  # only the first layout's envs wait
        index = {s.name: i for i, s in self._workers.items()}
        if plan.main.actor is None:
            self._actor_lanes = [RemoteLane(index[ap.host], ctrl, self._workers[index[ap.host]].start_sem, ap.host,
                                            self._main_waiter, max(1, int(ctrl["seq"][index[ap.host]])))
                                 for ap in plan.actors]
            return
        ap = plan.actors[0]
        if reused is not None:
            envs = reused.local_envs
        else:
            ids = plan.main.env_ids
            envs = make_env_runner(ids, self.env_fns, self.seed, self._generation, self.env_id_offset,
                                   {e: _unpickled(live[e]) for e in ids if e in live},
                                   check_finite=self.check_finite, defer=defer)
        host = ActorHost(ap, envs, lambda: self.policy, ctrl, self._lanes(ap, index), self._done_sem(0),
                         self._check_children, plan.config, self._spin_seconds(), self.worker_timeout,
                         (memoryview(ctrl["hdr"]), BEAT))
        host.waiter.kill_stuck = True
        host.pin_cpu = plan.main.cpus[0] if plan.main.cpus else None
        if host.local_policy is not None:
            self.policy.to(plan.config.policy_device)
            if self._caller_weights_version != self._weights_version and self._weights is not None:
                # Weights published while the policy ran only in other processes never reached
                # the caller's copy: load the current ones before it acts (from this process's
                # own mapping of the block, in place for a policy whose load copies them).
                WeightsBlock.load_into(self.policy, self._weights.arrays)
                self._caller_weights_version = self._weights_version
            host.local_policy.weights_version = self._weights_version
        if self._block is not None:
            host.bind(self._block.arrays)
        self._host = host
        self._actor_lanes = []

    def _write_header(self) -> None:
        if self._ctrl is None or self._block is None:
            return
        write_name(self._ctrl, 0, self._block.name)
        self._ctrl["hdr"][NUM_STEPS] = self._num_steps
        self._ctrl["hdr"][DATA_GEN] += 1

    def _on_new_block(self) -> None:
        self._write_header()
        if self._host is not None and self._block is not None:
            self._host.bind(self._block.arrays)

    # ------------------------------------------------------------------ collect
    def _run_actors(self, num_steps: int) -> tuple[float, float, float]:
        assert self._ctrl is not None
        if self._host is not None:
            # worker_timeout for the caller's own env share and replica (its remote lanes have
            # their Waiter): a stuck env there is interrupted and named, not a hang
            host = self._host
            self._caller_watchdog().run(host.collect, num_steps,
                                        timeout=max(self.worker_timeout, START_TIMEOUT_FLOOR) if host.fresh else None)
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
        asked = [(i, s) for i, s in self._workers.items() if s.conn is not None and self._ctrl["nfinal"][i] > 0]
        for i, s in asked:
            self._ctrl["cmd"][i] = FLUSH
            s.start_sem.release()
        for i, s in asked:
            finals.update(self._recv(i, s))
        return finals

    def _recv(self, i: int, s: Slot) -> Any:
        """What worker ``i`` sends on its pipe, watching it (dead: WorkerError; silent for
        ``worker_timeout``: stuck)."""
        t0 = time.monotonic()
        while not s.conn.poll(POLL_SECONDS):
            self._check_children()
            idle = time.monotonic() - t0
            if idle > self.worker_timeout:
                raise stuck_error(self._ctrl, i, s.name, idle, self.worker_timeout, self._applying, kill=True)
        return s.conn.recv()

    def _publish_weights(self, state: dict[str, np.ndarray], version: int) -> None:
        if state:
            self._weights = WeightsBlock.write(state, self._weights)
        if self._ctrl is not None:
            if self._weights is not None:
                write_name(self._ctrl, 1, self._weights.name)
            self._ctrl["hdr"][WEIGHTS_VERSION] = version
        if self._host is not None and self._host.local_policy is not None:
            self._host.local_policy.load(state, version)
            self._caller_weights_version = version

    # ------------------------------------------------------------------ faults, close
    def _check_children(self) -> None:
        procs = {s.proc.sentinel: (i, s) for i, s in self._workers.items() if s.proc is not None}
        if not procs:
            return
        dead = multiprocessing.connection.wait(list(procs), timeout=0)
        if dead:
            i, s = procs[dead[0]]  # type: ignore[index]
            s.proc.join(0.1)
            tb = ""
            if self._ctrl is not None and self._ctrl["status"][i] != OK:
                tb = read_error(self._ctrl, i)
            raise WorkerError(s.name, processes.exit_reason(s.proc.exitcode), tb, self._applying)

    def _end(self, ending: dict[int, Slot], ask: bool = True) -> None:
        """End the workers ``ending`` (no longer in ``_workers``, or all of them at close);
        unlink their semaphore names. ``ask``: send EXIT through the control block first (else
        signals alone)."""
        try:
            processes.end_slots(self._ctrl if ask else None, ending)
        finally:
            for i, s in ending.items():
                s.start_sem.unlink_name()
                self._workers.pop(i, None)

    def _caller_watchdog(self) -> CallerWatchdog:
        """The watchdog of the actor running in the caller (built once; it holds no reference
        to this executor, so an executor dropped without ``close()`` is still collected)."""
        if self._watchdog is None:
            me = weakref.ref(self)

            def progress() -> int:
                ex = me()
                return int(ex._ctrl["hdr"][BEAT]) if ex is not None and ex._ctrl is not None else 0

            self._watchdog = CallerWatchdog(self.worker_timeout, progress, "in the caller's process, shm actor 0",
                                            lambda: getattr(me(), "_applying", None) or getattr(me(), "_config", None))
        return self._watchdog

    def _close_workers(self) -> None:
        """End every worker (EXIT, then SIGTERM, then SIGKILL), then unlink the blocks and the
        semaphore names. The unlinking runs whatever happened before it."""
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None
        self._actor_lanes = []
        self._main_waiter = None
        try:
            if self._host is not None:
                host, self._host = self._host, None
                host.close()
            # Garbage-collected (``__del__``): the control block may be unmapped already, so no
            # EXIT through it, only signals; its name is still unlinked below.
            usable = not getattr(self, "_finalizing", False)
            if self._ctrl is not None and usable:
                self._ctrl["hdr"][CLOSING] = 1
            self._end({**self._leaving, **self._workers}, ask=usable)
        finally:
            self._workers, self._leaving = {}, {}
            self._close_control_block()
            if self._closed and self._weights is not None:
                self._weights.close()
                self._weights = None

    def _close_control_block(self) -> None:
        for sem in [self._main_sem, *self._done_sems.values()]:
            if sem is not None:
                sem.unlink_name()
        self._main_sem, self._done_sems = None, {}
        if self._ctrl is not None:
            self._ctrl.close()
            self._ctrl = None


def start_env_server_early(env: Any, num_envs: int) -> bool:
    """Start the server that an shm executor of ``env`` (``make_executor``'s first argument)
    forks its env workers from, now, under the forkserver start method: it imports the env
    factories' modules (SB3 and torch for an Atari model: seconds) in the background while the
    caller builds the executor, makes the start's envs in its own process and profiles them.
    For a caller that is about to start env workers anyway (the online tuner's wrap-time look
    on a many-core machine); the executor finds the same server (one per set of modules).
    True when started."""
    if get_context().get_start_method() != "forkserver":
        return False
    from auturi.executor.shm.forkservers import start_env_server

    start_env_server(_env_modules((env, None, num_envs), {}))
    return True


def _env_modules(args: tuple, kwargs: dict) -> tuple[str, ...]:
    """The modules the env factories (``Executor.__init__``'s first two arguments) import in
    a worker (:func:`~auturi.executor.shm.forkservers.modules_to_preload`), from the first one."""
    from auturi.envs import resolve_env_fns
    from auturi.executor.shm.forkservers import modules_to_preload

    try:
        env = args[0] if args else kwargs["env"]
        fns = resolve_env_fns(env, given_num_envs(args[2] if len(args) > 2 else kwargs.get("num_envs"),
                                                  args[3] if len(args) > 3 else kwargs.get("config")))
    except Exception:  # a bad env argument: the base constructor says why
        return ()
    return modules_to_preload(fns[0]) if fns else ()


_SERVING = threading.Event()
_SERVING.set()
"""The ``_warm`` entry of a server a started process forked from: it serves."""
WARM_TIMEOUT = 300.0
"""Seconds :meth:`ShmExecutor.warm_start`'s watcher waits for a server's imports; past them
``warming`` ends anyway (a trial must not wait forever on a hung import) and the reconfigure
that needs the server reports what is wrong with it."""


def _first_layout_forks_policy(args: tuple, kwargs: dict) -> bool:
    """Whether the config an executor is built with (``Executor.__init__``'s fourth argument;
    default serial) runs a policy in a process of its own (an actor's or a replica's)."""
    config = args[3] if len(args) > 3 else kwargs.get("config")
    if config is None:
        return False
    try:
        return any(p.kind != MAIN and p.device is not None for p in plan_layout(config).processes)
    except Exception:  # an invalid config: the base constructor says why
        return False


def _role(p: ProcessPlan) -> tuple:
    """What a worker does, as a reconfigure keeps it: ``ProcessPlan.role`` and its actor,
    less a replica's torch threads (set on the live replica instead)."""
    if p.kind == "policy":
        return ("policy", p.actor, p.replica, p.device)
    return (p.role, p.actor)


def _pickled(env: Any) -> bytes | None:
    """An env for another process: a pickle as it came, ``None`` (not reset yet) as it is,
    main's own live env pickled here (``b""``: it cannot be; it is recreated, its episode cut)."""
    if env is None or isinstance(env, bytes):
        return env
    try:
        return dumps_env(env)
    except Exception:
        return b""


def _close_envs(envs: Any) -> None:
    """Close the live envs (main's) that are not handed on: they are recreated elsewhere."""
    for env in envs:
        if env is not None and not isinstance(env, bytes):
            try:
                env.close()
            except Exception:  # best effort, as EnvRunner.close
                pass


def _unpickled(env: Any) -> Any:
    return cloudpickle.loads(env) if isinstance(env, bytes) else env
