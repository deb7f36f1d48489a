"""Process entry points of the ``shm`` backend (env workers, policy replicas, actors) and
:class:`ActorHost`, the actor's side of the hierarchy, used in an actor process or, when
there is one actor, in the caller's process.

Over 400 lines: the entry point, the serve loops and :class:`ActorHost` are one process's side
of the control block's protocol (commands, ``seq``, ``beat``, ``starting``), read together."""
from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import math
import os
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import cloudpickle
import numpy as np

from auturi.config import Config
from auturi.executor.actor_loop import ActorLoop, slice_stepper
from auturi.executor.buffers import ArrayBlock, make_layout
from auturi.executor.env_calls import answer_env_call, no_env_objects_message
from auturi.executor.env_runner import EnvRunner, make_env_runner
from auturi.executor.layout import ActorPlan
from auturi.executor.local_lanes import LocalEnvLane, LocalPolicyLane
from auturi.executor.policy_runner import PolicyRunner
from auturi.executor.shm.channel import (DATA_GEN, DUMP_SIGNAL, ENV_CALL, EXIT, EXPORT, FLUSH, NUM_STEPS, OK, OWNER,
                                         REPLAN, RESET, STEP_QUEUE, STEP_ROW, THREADS, WEIGHTS_VERSION, RemoteLane,
                                         RowGroup, TaskQueues, Waiter, acquire, parent_watch, read_name, write_error)
from auturi.executor.shm.processes import exit_with_owner, sigterm_exits
from auturi.executor.spec import WorkloadSpec

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def sync_policy_weights(runner: PolicyRunner, ctrl: ArrayBlock) -> None:
    """Load the published weights if a newer version is out (one int compare otherwise: a
    replica whose version is current copies nothing). The values go from the shared block
    straight into the policy's parameters (``PolicyRunner.load_published``), with no private
    host copy first unless the policy keeps what it loads (``WeightsBlock.load_into``)."""
    version = int(ctrl["hdr"][WEIGHTS_VERSION])
    if version != runner.weights_version:
        name = read_name(ctrl, 1)
        if name:
            runner.load_published(name, version)
        else:
            runner.weights_version = version


class DataBinding:
    """Keeps a worker attached to the current rollout block (it changes with num_steps)."""

    def __init__(self, ctrl: ArrayBlock, spec: WorkloadSpec, num_envs: int):
        self.ctrl, self.spec, self.num_envs = ctrl, spec, num_envs
        self.gen = -1
        self.block: ArrayBlock | None = None

    def sync(self, *runners: Any) -> None:
        gen = int(self.ctrl["hdr"][DATA_GEN])
        if gen == self.gen:
            return
        layout, size = make_layout(self.spec.rollout_specs(int(self.ctrl["hdr"][NUM_STEPS]), self.num_envs))
        block = ArrayBlock(layout, size, shared=True, name=read_name(self.ctrl, 0), create=False)
        for r in runners:
            if r is not None:
                r.bind(block.arrays)
        if self.block is not None:
            self.block.close()
        self.block, self.gen = block, gen

    def close(self) -> None:
        if self.block is not None:
            self.block.close()
            self.block = None


PIN_MIN_ROWS = 8
"""Collects shorter than this leave the caller's thread unpinned. Pinning is two affinity
syscalls per collect and a migration when the thread sits on another core: ~10 us at the
median but 150-500 us on average on this 2-core VM under load (the migration waits for the
target core), while what it saves is per row. For off-policy ``train_freq=1`` collects (one
row) the pin was most of the parallel layouts' overhead: 8 HalfCheetahs on degree 2, 5
interleaved rounds at load 4, 4,481 us per 1-step collect pinned against 2,609 unpinned.

An actor with a single env worker is never pinned either: the caller and its one worker are
two runnable threads the scheduler places on two cores by itself, and a pinned caller could
not leave a core another program (or the learner's threads) took: interleaved at load ~4,
degree 2 on 8 HalfCheetahs ran 1,878 us a row pinned against 775 unpinned (64-row collects),
and one-env-per-context CartPole at N = 2 0.40-0.62x the bare prototype pinned against
0.50-0.91x unpinned in 6 runs; in a later, calmer run both measured the same (438 vs 430 us a row). With
several workers a core the pin still pays (CartPole N = 16 and 32: 1.14x the prototype
pinned, 0.93x and 1.07x unpinned)."""


class ActorHost:
    """One actor, as its plan (:class:`~auturi.executor.layout.ActorPlan`) says: its lanes
    (local or remote) and its :class:`ActorLoop`.

    ``envs`` is the runner of the share this process steps itself (share 0). ``lanes``
    describes the remote lanes: ``{"env": [(slot, start_sem, name, issued)], "policy": [...]}``
    (``issued``: commands the worker has reported so far, 1 for a new one); an empty
    ``policy`` list means inference runs here, on the policy ``policy()`` loads.
    """

    def __init__(self, plan: ActorPlan, envs: Any, policy: Callable[[], Any], ctrl: ArrayBlock,
                 lanes: dict[str, list], done_sem: Any, check_health: Any, config: Config | None = None,
                 spin: float = 0.0, timeout: float = math.inf, beat: tuple[Any, int] | None = None):
        self.actor, self.ctrl = plan.index, ctrl
        actor = plan.index
        self.local_policy: PolicyRunner | None = None
        self.waiter = Waiter(done_sem, ctrl, check_health, config, spin, timeout, beat)
        # The actor steps the first share of its envs itself, between handing out the other
        # shares and waiting for them: one process fewer, and the actor's core works instead
        # of idling (an idle vCPU was measured to take 0.1-2 ms to wake).
        self.local_envs = envs
        env_lanes: list = [LocalEnvLane(self.local_envs, f"envs of actor {actor}")]
        env_lanes += [RemoteLane(s, ctrl, sem, name, self.waiter, issued) for s, sem, name, issued in lanes["env"]]
        if lanes["policy"]:
            pol_lanes = [RemoteLane(s, ctrl, sem, name, self.waiter, issued) for s, sem, name, issued in lanes["policy"]]
        else:
            self.local_policy = PolicyRunner(policy())
            pol_lanes = [LocalPolicyLane(self.local_policy, f"policy of actor {actor}")]
        self.remote_env_lanes = [lane for lane in env_lanes if lane.remote]
        self._lanes, self._beat = (env_lanes, pol_lanes), beat
        self._queues: TaskQueues | None = None  # made once, when a plan first overlaps
        self.loop = self._loop(plan)
        self.fresh = True
        # this actor's control-block slot when it runs in a process of its own (whoever waits
        # for it reads its ``starting`` word); None in the caller's process, which nobody watches
        self.slot: int | None = None

    def _loop(self, plan: ActorPlan) -> ActorLoop:
        return ActorLoop(plan.env_ids, *self._lanes, plan.batch_size, self.waiter,
                         lambda remotes: RowGroup(remotes, self.waiter), self._beat, lockstep=plan.lockstep,
                         overlap=plan.overlap, task_queues=self._task_queues)

    def _task_queues(self, env_lanes: list, policy_lanes: list) -> TaskQueues:
        if self._queues is None:
            self._queues = TaskQueues(env_lanes, policy_lanes, self.waiter)
        return self._queues

    def replan(self, plan: ActorPlan, config: Config | None = None) -> None:
        """Run ``plan`` from now on: the same envs, policy and workers (lanes), another loop
        (a new batch size, and with it maybe lockstep or overlap).

        Every lane is idle here, but a kept replica may have run a command of the caller's
        meanwhile (THREADS, on a batch change), which this actor's count of its commands
        does not know: each count is read again from ``seq``. A count one short made the
        general loop take every later task of that replica as done as soon as it was handed
        out, and read actions before they were written (2 of 3 runs of 2 actors x 4 envs,
        degree 2, 2 replicas, batch 2 -> 1 collected other data than serial)."""
        seq = self.ctrl["seq"]
        remotes = [lane for lanes in self._lanes for lane in lanes if lane.remote]
        for lane in remotes:
            lane.issued = max(1, int(seq[lane.slot]))
        self.waiter.adopt(remotes)
        wait, self.loop = self.loop.wait_seconds, self._loop(plan)
        self.loop.wait_seconds = wait  # the caller's timings count on
        self.waiter.config = config
        if self.local_policy is not None:
            self.local_policy.recalibrate()  # the thread rule chooses again for the new batch

    def bind(self, arrays: dict[str, np.ndarray]) -> None:
        for r in (self.local_envs, self.local_policy):
            if r is not None:
                r.bind(arrays)

    pin_cpu: int | None = None
    """In the caller's process: the core this thread keeps during a collect (see collect)."""

    def collect(self, num_steps: int) -> None:
        if self.pin_cpu is None or num_steps < PIN_MIN_ROWS or len(self.remote_env_lanes) < 2:
            return self._collect(num_steps)
        # The actor thread and its env workers on different cores. Unpinned, a woken worker
        # preempted the actor on the actor's own core and the pair ran one after the other
        # (measured: a 2-worker step took the time of both). Only the calling thread is
        # pinned, only for the collect, and its own affinity is restored after.
        try:
            before = os.sched_getaffinity(0)
        except AttributeError:  # not Linux
            return self._collect(num_steps)
        if self.pin_cpu not in before:
            return self._collect(num_steps)
        os.sched_setaffinity(0, {self.pin_cpu})
        try:
            self._collect(num_steps)
        finally:
            os.sched_setaffinity(0, before)

    def _collect(self, num_steps: int) -> None:
        if self.fresh:  # a new host: the envs not reset yet (new ones) reset first; live ones go on
            # the workers' first resets run while this process does its own (one after the
            # other, a worker's and ours added up)
            for lane in self.remote_env_lanes:
                lane.command(RESET)
            if self.local_envs.fresh:
                with starting(self.ctrl, self.slot):
                    self.local_envs.reset_all()
            self.waiter.wait_all([])
            self.fresh = False
        self.loop.run(num_steps)

    def seconds(self) -> tuple[float, float, float]:
        return (self.local_envs.env_seconds,
                self.local_policy.policy_seconds if self.local_policy else 0.0,
                self.loop.wait_seconds)

    def close(self) -> None:
        self.local_envs.close()


@contextlib.contextmanager
def starting(ctrl: ArrayBlock, slot: int | None) -> Iterator[None]:
    """Mark the worker of ``slot`` (None: the caller's process, which nobody watches) as doing
    start-up work for the block: its envs' first resets, which the waiter above it allows
    ``max(worker_timeout, START_TIMEOUT_FLOOR)`` (``channel.Waiter``)."""
    words = ctrl["starting"] if slot is not None else None
    if words is not None:
        words[slot] = 1
    try:
        yield
    finally:
        if words is not None:
            words[slot] = 0


def report_progress(runner: Any, ctrl: ArrayBlock, slot: int) -> None:
    """Have ``runner`` bump this worker's ``beat`` after each single env's reset or step
    returns (``EnvRunner.on_progress``), so ``worker_timeout`` bounds one env's silence, not
    the sum over the envs one command steps (2 envs x a 10 s reset tripped a 12 s timeout).
    A runner of one env needs none: the command's own report follows that env's return."""
    if len(getattr(runner, "env_ids", ())) < 2:
        return
    beat = memoryview(ctrl["beat"])  # plain CPython word access: ~60 ns a bump, per env step

    def bump() -> None:
        beat[slot] += 1

    runner.on_progress = bump


# --------------------------------------------------------------------------- processes
def _set_torch_threads(threads: int) -> None:
    if threads > 0 and "torch" in sys.modules:
        import torch

        torch.set_num_threads(threads)


def register_stack_dump() -> int:
    """Have ``faulthandler`` write this process's Python stack (all threads) to an anonymous
    file on ``DUMP_SIGNAL``; returns its fd, which a process that finds us stuck reads through
    ``/proc/<pid>/fd/<fd>`` (``channel.process_stack``). A C-level handler: it dumps even
    while the main thread is stuck in C code holding the GIL. Nothing is left on disk."""
    dump = tempfile.TemporaryFile()
    register_stack_dump.file = dump  # type: ignore[attr-defined]  # kept open for the process's life
    faulthandler.register(DUMP_SIGNAL, file=dump, all_threads=True, chain=False)
    return dump.fileno()


KEEP_FREED_BYTES = 256 << 20
"""Freed heap memory a worker keeps for reuse instead of returning it to the kernel."""


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory in this process (a worker's, never the caller's):
    allocations up to 32 MiB come from the heap and up to :data:`KEEP_FREED_BYTES` of free
    heap stays mapped. By default an allocation above ~128 KiB is a fresh ``mmap`` (or a heap
    top trimmed after its free), so every such array an env or policy makes per step is
    page-faulted in and zeroed by the kernel again: an env building ~1 MB frames from float64
    temporaries (``largeobs``) took ~3,000 page faults per step in a fresh worker. Returns
    whether it applied (glibc only)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): its own allocator decides
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    # 32 MiB is glibc's largest mmap threshold on 64-bit; setting it also fixes the trim threshold
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, KEEP_FREED_BYTES))


@dataclass
class WorkerStart:
    """What a worker process starts from, out of the layout plan (``ShmExecutor._start_one``):
    the plan's process entry made concrete for one slot. An actor's also carries its part of
    the plan and the remote lanes it drives."""

    seed: int
    generation: int
    id_offset: int
    spin: float  # seconds a wait polls before it blocks (channel.SPIN_SECONDS)
    timeout: float  # worker_timeout
    check_finite: bool
    cpus: set[int]  # the cores it is pinned to (empty: not pinned)
    device: str | None  # where its policy runs (None: it runs none)
    threads: int | None  # its torch threads
    env_ids: list[int]  # the envs it steps (global indices)
    live: dict[int, bytes | None] = field(default_factory=dict)  # envs moved here mid-episode, pickled
    plan: Any = None  # an actor's ActorPlan
    config: Any = None  # an actor's layout config
    report_sem: Any = None  # an actor reports its collects to the caller here
    lanes: dict[str, list] | None = None  # an actor's remote lanes: (slot, start_sem, name, commands)


def worker_main(kind: str, slot: int, ctrl_handle: tuple, start_sem: Any, done_sem: Any, ready_sem: Any,
                payloads: tuple[bytes, bytes], spec: WorkloadSpec, num_envs: int, info: WorkerStart, conn: Any) -> None:
    """Entry point of every worker process. ``kind`` is ``env``, ``policy`` or ``actor``."""
    # Ctrl-C reaches the whole process group; the caller handles it and ends us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sigterm_exits()  # SIGTERM (the caller's, or our own when the owner is gone) unwinds: envs close
    keep_freed_memory()
    for var in THREAD_VARS:
        os.environ[var] = "1"
    if info.cpus:
        # Spread env workers over the cores: woken by one process, the scheduler would
        # otherwise stack them on the waker's core and leave the others idle for
        # milliseconds (measured: 2 workers ran at the speed of 1 on a 2-core machine).
        try:
            os.sched_setaffinity(0, info.cpus)
        except (AttributeError, OSError):
            pass
    try:
        ctrl = ArrayBlock.attach(ctrl_handle)
    except FileNotFoundError:  # the caller closed the layout while we started (Ctrl-C): nothing to report
        return
    if not exit_with_owner(int(ctrl["hdr"][OWNER])):  # the caller died while we started
        ctrl.close()
        return
    ctrl["pid"][slot] = os.getpid()
    ctrl["dumpfd"][slot] = register_stack_dump()
    check_parent = parent_watch(ctrl)
    data = DataBinding(ctrl, spec, num_envs)
    obj: Any = None
    try:
        # Each process unpickles only what it runs: the policy would import torch.
        def env_fns() -> list:
            return cloudpickle.loads(payloads[0])

        def policy() -> Any:
            p = cloudpickle.loads(payloads[1])
            p.to(info.device)
            return p

        if kind == "policy":
            obj = PolicyRunner(policy())
            _set_torch_threads(info.threads)
        else:
            # the factories first: unpickling them sets up this process for their envs (id
            # providers imported, warnings the owner showed silenced) before moved envs arrive
            fns = env_fns()
            live = {i: cloudpickle.loads(b) for i, b in info.live.items() if b}  # envs moved here mid-episode
            envs = make_env_runner(info.env_ids, fns, info.seed, info.generation, info.id_offset,
                                   live, check_finite=info.check_finite)
            report_progress(envs, ctrl, slot)
            if kind == "env":
                obj = envs
            else:
                obj = ActorHost(info.plan, envs, policy, ctrl, info.lanes, done_sem, check_parent,
                                info.config, info.spin, info.timeout, (memoryview(ctrl["beat"]), slot))
                obj.slot = slot
                if obj.local_policy is not None:
                    _set_torch_threads(info.threads)
                done_sem = info.report_sem  # an actor reports to the caller, not to itself
        ctrl["status"][slot] = OK
    except BaseException as exc:  # report construction failures (bad env, bad policy) too
        write_error(ctrl, slot, exc)
    ctrl["seq"][slot] += 1
    ready_sem.release()
    if ctrl["status"][slot] != OK:
        return _shutdown(obj, data, ctrl)
    try:
        _serve(kind, slot, obj, ctrl, data, start_sem, done_sem, conn, check_parent, info.spin)
    except SystemExit:
        pass
    finally:
        _shutdown(obj, data, ctrl)


def _serve(kind: str, slot: int, obj: Any, ctrl: ArrayBlock, data: DataBinding, start_sem: Any, done_sem: Any,
           conn: Any, check_parent: Any, spin: float) -> None:
    cmd_arr, seq, status, ntask, tasks, timing = (ctrl["cmd"], ctrl["seq"], ctrl["status"], ctrl["ntask"],
                                                  ctrl["tasks"], ctrl["timing"])
    if kind == "env":
        lo, hi = obj.env_ids[0], obj.env_ids[-1] + 1
        step_row = slice_stepper(obj)
    taken = False  # a command was taken from start_sem by the row loop and awaits handling
    while True:
        if taken:
            taken = False
        elif not acquire(start_sem, spin, 1.0):
            check_parent()
            continue
        cmd = int(cmd_arr[slot])
        if cmd == STEP_ROW and kind == "env":
            _serve_rows(slot, obj, ctrl, data, start_sem, done_sem, check_parent, spin, step_row, lo, hi)
            taken = True
            continue
        if cmd == STEP_QUEUE and kind == "env":
            _serve_queue(slot, obj, ctrl, data, start_sem, done_sem, check_parent, spin)
            taken = True
            continue
        if cmd == EXIT:
            return
        if cmd == FLUSH:  # hand over final observations; the caller is reading the pipe
            runner = obj if kind == "env" else obj.local_envs
            conn.send(runner.take_finals())
            ctrl["nfinal"][slot] = 0
            continue
        if cmd == EXPORT:  # this process ends in a reconfigure: its envs travel on, mid-episode
            runner = obj if kind == "env" else obj.local_envs
            export = getattr(runner, "export_envs", None)
            conn.send(export() if export is not None and ctrl["arg"][slot] else {})
            continue
        if cmd == ENV_CALL:  # a call on the live envs (Executor.env_call): request and answer on the pipe
            runner = obj if kind == "env" else obj.local_envs
            conn.send(answer_env_call(_runner_call(runner), conn.recv(), lambda: getattr(runner, "travel_checks", {})))
            continue
        if cmd == THREADS and kind == "policy":  # a kept replica under a layout with other free cores
            _set_torch_threads(int(ctrl["arg"][slot]))
            obj.recalibrate()  # the thread rule compares 1 with the process's count: choose again
            status[slot] = OK
            seq[slot] += 1
            done_sem.release()
            continue
        try:
            if kind == "env":
                data.sync(obj)
                if cmd == RESET:
                    if obj.fresh:  # a kept worker's envs go on under a new host
                        with starting(ctrl, slot):
                            obj.reset_all()
                else:
                    n = int(ntask[slot])
                    obj.step(tasks[slot, :n, 0], tasks[slot, :n, 1])
                ctrl["nfinal"][slot] = len(obj.finals)
                timing[slot, 0] = obj.env_seconds
            elif kind == "policy":
                data.sync(obj)
                sync_policy_weights(obj, ctrl)
                n = int(ntask[slot])
                obj.act(tasks[slot, :n, 0].copy(), tasks[slot, :n, 1].copy())
                timing[slot, 1] = obj.policy_seconds
            elif cmd == REPLAN:  # a kept actor: its new plan waits on its pipe
                obj.replan(*conn.recv())
            else:
                data.sync(obj.local_envs, obj.local_policy)
                if obj.local_policy is not None:
                    sync_policy_weights(obj.local_policy, ctrl)
                obj.collect(int(ctrl["arg"][slot]))
                ctrl["nfinal"][slot] = len(obj.local_envs.finals)
                timing[slot] = obj.seconds()
            status[slot] = OK
        except SystemExit:
            raise
        except BaseException as exc:
            write_error(ctrl, slot, exc)
        seq[slot] += 1
        done_sem.release()
        if status[slot] != OK and kind == "actor":
            return  # the caller tears everything down after an actor failed


def _serve_rows(slot: int, obj: Any, ctrl: ArrayBlock, data: DataBinding, start_sem: Any, done_sem: Any,
                check_parent: Any, spin: float, step_row: Any, lo: int, hi: int) -> None:
    """An env worker in the lockstep loop: step the row in ``arg``, report, wait, for as
    long as the commands are STEP_ROW; returns having taken the first other command from
    ``start_sem``. Kept to the bare minimum of Python: with many workers per core each
    one's code runs cache-cold after every switch, and a worker stepping one CartPole used
    ~55 us of CPU per row in the general loop, 6 of them in ``env.step``."""
    # memoryviews: plain CPython item access, no numpy scalar machinery on this path.
    cmd_arr, arg, seq, status, nfinal, hdr = (memoryview(ctrl[k]) for k in ("cmd", "arg", "seq", "status", "nfinal", "hdr"))
    timing = memoryview(ctrl["timing"]).cast("B").cast("d")  # 1-D words (raises if not contiguous): no tuple index
    env_time = slot * ctrl["timing"].shape[1]
    status[slot] = OK  # rows report a failure by ERROR; a success leaves this as it is
    gen_word = DATA_GEN  # a local: no global lookup per row
    # a lone env: no step_slice hop (EnvRunner's, whose return value says an episode ended)
    step_one = obj.step_one if hi - lo == 1 and isinstance(obj, EnvRunner) else None
    while True:
        try:
            if hdr[gen_word] != data.gen:  # a new rollout block (num_steps changed)
                data.sync(obj)
            if step_one is not None:
                if step_one(arg[slot], lo):  # the episode ended: one more final to hand over
                    nfinal[slot] = len(obj.finals)
            else:
                n = len(obj.finals)
                step_row(arg[slot], lo, hi)
                if len(obj.finals) != n:
                    nfinal[slot] = len(obj.finals)
            timing[env_time] = obj.env_seconds
        except SystemExit:
            raise
        except BaseException as exc:
            write_error(ctrl, slot, exc)
        seq[slot] += 1
        done_sem.release()
        if status[slot] != OK:
            return _wait_command(start_sem, spin, check_parent)
        if not acquire(start_sem, spin, 1.0):  # no row for a second: between collects
            check_parent()
            _wait_command(start_sem, spin, check_parent)
        if cmd_arr[slot] != STEP_ROW:
            return


def _serve_queue(slot: int, obj: Any, ctrl: ArrayBlock, data: DataBinding, start_sem: Any, done_sem: Any,
                 check_parent: Any, spin: float) -> None:
    """An env worker in the overlapped loop (``channel.TaskQueues``): step the post queued at
    ``qpos`` (its envs at their rows, which may differ), move ``qpos`` past it, report, wait,
    for as long as the commands are STEP_QUEUE; returns having taken the first other command
    from ``start_sem``. Posts queued while it stepped are waiting already: it goes from one to
    the next with no round trip to the actor. Kept as lean as :func:`_serve_rows`."""
    cmd_arr, seq, status, nfinal, hdr, qpos = (memoryview(ctrl[k]) for k in ("cmd", "seq", "status", "nfinal", "hdr",
                                                                           "qpos"))
    timing = memoryview(ctrl["timing"]).cast("B").cast("d")
    env_time = slot * ctrl["timing"].shape[1]
    rows = ctrl["tasks"][slot]  # (ring, 3): row, env, count (in a post's first entry)
    words = memoryview(rows).cast("B").cast("q")  # the same, as plain words
    ring = rows.shape[0]
    status[slot] = OK  # a failure reports ERROR; a success leaves this as it is
    gen_word = DATA_GEN
    step_one = obj.step_one if isinstance(obj, EnvRunner) else None
    while True:
        try:
            if hdr[gen_word] != data.gen:  # a new rollout block (num_steps changed)
                data.sync(obj)
            p = qpos[slot]
            n = words[3 * p + 2]
            if n == 1 and step_one is not None:
                if step_one(words[3 * p], words[3 * p + 1]):  # the episode ended: one more final
                    nfinal[slot] = len(obj.finals)
            else:
                at = (p + np.arange(n)) % ring
                before = len(obj.finals)
                obj.step(rows[at, 0], rows[at, 1])
                if len(obj.finals) != before:
                    nfinal[slot] = len(obj.finals)
            qpos[slot] = (p + n) % ring
            timing[env_time] = obj.env_seconds
        except SystemExit:
            raise
        except BaseException as exc:
            write_error(ctrl, slot, exc)
        seq[slot] += 1
        done_sem.release()
        if status[slot] != OK:
            return _wait_command(start_sem, spin, check_parent)
        if not acquire(start_sem, spin, 1.0):  # nothing queued for a second: between collects
            check_parent()
            _wait_command(start_sem, spin, check_parent)
        if cmd_arr[slot] != STEP_QUEUE:
            return


def _runner_call(runner: Any) -> Any:
    """``runner.call`` (an :class:`EnvRunner`'s), or one that says why a vector-env runner has
    none (the caller refuses those calls first; this is the worker's own word on it)."""
    call = getattr(runner, "call", None)
    if call is not None:
        return call

    def refuse(_call: Any) -> Any:
        raise RuntimeError(no_env_objects_message(getattr(runner, "source", runner)))

    return refuse


def _wait_command(start_sem: Any, spin: float, check_parent: Any) -> None:
    while not acquire(start_sem, spin, 1.0):
        check_parent()


def _shutdown(obj: Any, data: DataBinding, ctrl: ArrayBlock) -> None:
    try:
        if obj is not None and hasattr(obj, "close"):
            obj.close()
    finally:
        data.close()
        ctrl.close()
