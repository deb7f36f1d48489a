"""The ``ray`` backend: each actor of the config is a Ray actor, anywhere on a Ray cluster.

Layout for a config of ``A`` actors of ``E`` envs:

- Ray actor ``a`` (:class:`RayActorHost`) owns global envs ``a*E .. (a+1)*E - 1``. On its node
  it runs a local ``shm`` executor over them with the sub-config ``Config(1, E, degree,
  policies, batch, device)``: the same env workers, replicas, shared memory and actor loop as
  the ``shm`` backend (all in the Ray actor's process for a serial sub-config).
- It asks Ray for ``Config.processes_per_actor`` CPUs (and one GPU for a CUDA policy) in one
  bundle of a ``SPREAD`` placement group, so actors spread over the alive nodes and each
  actor's processes share one node (an actor never spans nodes). ``actor_nodes`` records
  where each actor landed.
- One remote call per actor per collect (never one per env step): ``collect(num_steps)``
  returns that actor's columnar :class:`~auturi.Rollout`; the caller copies it into its
  columns of the whole. Seeds, noise streams and final-observation keys use global env
  indices (``Executor.env_id_offset``), so the data equals the serial backend's bit for bit.
- Weights: ``set_policy_state`` puts the state in the object store once and hands the
  reference to every actor once per update.
- ``reconfigure`` ends the Ray actors and starts new ones, with the next env generation
  (fresh seeds, new episodes), exactly as ``shm`` recreates its workers.

Connecting (``address``): ``None`` uses the Ray instance this process is already connected
to, else the cluster in ``RAY_ADDRESS``, else starts a local instance sized to this machine;
``"auto"``, ``"host:port"`` or ``"ray://..."`` connect to an existing cluster. A local instance
Auturi started is shut down when the last Ray executor using it closes; a cluster you
connected to, or a ``ray.init()`` you made yourself, is never shut down by Auturi.

Failure policy: nothing is restarted. A Ray actor that raises, dies (killed, out of memory,
its node lost) or loses a worker of its own, during a collect, a weight update or start-up,
surfaces as :class:`auturi.WorkerError` naming the actor, its envs, its node and the cause
(the remote traceback, or Ray's death cause), and the executor closes, as with ``shm``: no
partial rollout is returned, so no data is silently dropped. Every wait is a loop of short
``ray.wait`` calls that also checks the actors' nodes are alive, so nothing hangs on a lost
node. ``close()`` (also on errors and Ctrl-C) asks idle actors to close their executors (which
ends their processes and unlinks their shared memory), then kills every Ray actor; a busy actor
is killed at once, and its processes end by themselves (each watches its parent) and its
segments are unlinked by its resource tracker.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from auturi.config import Config
from auturi.errors import AuturiError, ConfigError, WorkerError
from auturi.executor.base import Executor
from auturi.executor.shm import ShmExecutor
from auturi.executor.shm.channel import BEAT, DUMP_SECONDS, process_stack, stuck_reason

POLL_SECONDS = 0.2
"""Longest single ``ray.wait``; between them the caller may be interrupted."""
LIVENESS_SECONDS = 2.0
"""How often a long wait checks that the nodes of the actors it waits for are alive."""
CLOSE_SECONDS = 10.0
"""How long ``close()`` lets idle actors close their executors before killing them."""
PROBE_SECONDS = 0.5
"""How often a collect asks each busy actor for its progress (``worker_timeout``)."""


# ----------------------------------------------------------------------------- cluster
@dataclass(frozen=True)
class ClusterResources:
    """CPUs and GPUs of each alive node of a Ray cluster (see :func:`ray_cluster_resources`)."""

    node_cpus: tuple[int, ...]
    node_gpus: tuple[int, ...] = ()

    @property
    def total_cpus(self) -> int:
        return sum(self.node_cpus)

    @property
    def total_gpus(self) -> int:
        return sum(self.node_gpus)

    def actors_that_fit(self, config: Config) -> int:
        """How many actors of ``config`` the nodes hold (an actor's processes share a node)."""
        procs = config.processes_per_actor
        gpus = self.node_gpus or (0,) * len(self.node_cpus)
        if config.policy_device == "cpu":
            return sum(c // procs for c in self.node_cpus)
        return sum(min(c // procs, int(g)) for c, g in zip(self.node_cpus, gpus))

    def problem(self, config: Config) -> str | None:
        """Why the cluster cannot run ``config`` (one CPU per process, one GPU per actor
        with a CUDA policy), or None."""
        found = self.knob_problem(config)
        return found[1] if found else None

    def knob_problem(self, config: Config) -> tuple[str, str] | None:
        """:meth:`problem` with the knob to change: ``(knob, reason)`` or None."""
        procs = config.processes_per_actor
        biggest = max(self.node_cpus, default=0)
        if procs > biggest:
            return ("env_parallel_degree", f"an actor runs {procs} processes but the largest node has {biggest} "
                                           f"CPUs (an actor cannot span nodes)")
        if config.policy_device != "cpu" and not self.total_gpus:
            return "policy_device", "no GPU in the Ray cluster"
        fits = self.actors_that_fit(config)
        if fits < config.num_actors:
            need = f"{procs} CPUs" + (" and a GPU" if config.policy_device != "cpu" else "")
            return ("num_actors", f"{config.num_actors} actors of {need} each do not fit the cluster's nodes "
                                  f"(CPUs {list(self.node_cpus)}, GPUs {list(self.node_gpus)}): {fits} fit")
        return None


def ray_cluster_resources() -> ClusterResources:
    """The alive nodes' CPUs and GPUs of the Ray cluster this process is connected to."""
    import ray

    if not ray.is_initialized():
        raise AuturiError("not connected to a Ray cluster: call ray.init(...) or make a ray executor first")
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return ClusterResources(tuple(int(n["Resources"].get("CPU", 0)) for n in nodes),
                            tuple(int(n["Resources"].get("GPU", 0)) for n in nodes))


_lock = threading.Lock()
_local = {"started": False, "users": 0}  # the local instance Auturi started, and its executors


def connect(address: str | None) -> bool:
    """Connect this process to Ray (see the module docstring); True when it uses a local
    instance Auturi started (then :func:`release` must be called once)."""
    import ray

    with _lock:
        if ray.is_initialized():
            current = ray.get_runtime_context().gcs_address
            if address not in (None, "auto", current):
                raise AuturiError(f"this process is already connected to the Ray cluster at {current}, "
                                  f"not address={address!r}: Ray talks to one cluster per process "
                                  f"(ray.shutdown() first, or pass address=None)")
            if _local["started"]:
                _local["users"] += 1
            return bool(_local["started"])
        target = address if address is not None else (os.environ.get("RAY_ADDRESS") or None)
        quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
        try:
            if target is not None:
                _check_reachable(target)
            if target is None:
                # "local": always a new instance, never one another process left on this machine
                ray.init(address="local", num_cpus=_usable_cores(), include_dashboard=False, **quiet)
                _local.update(started=True, users=1)
                return True
            ray.init(address=target, **quiet)
        except Exception as exc:
            raise AuturiError(
                f"cannot connect to a Ray cluster at address={target!r}: {type(exc).__name__}: {exc}\n"
                f"  Start one on the head node with `ray start --head` (then address='auto' or "
                f"'HOST:6379'), or pass address=None (and unset RAY_ADDRESS) for a local Ray instance.") from exc
        return False


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a ``host:port`` nobody listens on: ``ray.init`` retries such an
    address for minutes before it gives up."""
    hostport = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", or a form Ray resolves itself
    with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout):
        pass


def release() -> None:
    """One executor stopped using the local instance; shut it down when none uses it."""
    import ray

    with _lock:
        _local["users"] -= 1
        if _local["users"] <= 0 and _local["started"]:
            _local.update(started=False, users=0)
            ray.shutdown()


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# ----------------------------------------------------------------------------- actor side
class SliceExecutor(ShmExecutor):
    """A ``shm`` executor over a slice of a larger collection: its envs are the global envs
    ``env_id_offset ..``, its first layout starts at env generation ``generation`` and its
    noise streams at ``steps_done`` steps, so it runs exactly as its envs would inside the
    whole after that many steps and reconfigures."""

    def __init__(self, *args: Any, generation: int = 0, steps_done: int = 0, **kwargs: Any):
        self._first_generation = generation
        super().__init__(*args, **kwargs)
        self._steps_done = steps_done

    def _apply_config(self, config: Config) -> None:
        if self._generation < 0:
            self._generation = self._first_generation - 1  # the base class adds one
        super()._apply_config(config)

    def kill_workers(self) -> None:
        """SIGKILL every worker process (from another thread, while a collect may be
        waiting on them: that collect then fails, and the executor closes itself)."""
        for s in list(self._slots):
            if s.proc is not None and s.proc.pid is not None:
                try:
                    os.kill(s.proc.pid, signal.SIGKILL)
                except OSError:  # already gone
                    pass


class RayActorHost:
    """The body of one Ray actor: a :class:`SliceExecutor` over its envs, on its node."""

    def __init__(self) -> None:
        from auturi.executor.shm.worker import register_stack_dump

        self.ex: SliceExecutor | None = None
        self.dumpfd = register_stack_dump()  # read by whoever finds this actor stuck

    def progress(self) -> int:
        """Runs in the ``control`` thread: this actor's progress word (rows stepped, waits;
        it also moves while the actor waits on a worker of its own, which it watches itself).
        A stopped actor, or one stuck in C code holding the GIL, does not answer."""
        ex = self.ex
        ctrl = None if ex is None else ex._ctrl
        return -1 if ctrl is None else int(ctrl["hdr"][BEAT])

    def where(self) -> dict[str, Any]:
        import ray

        try:
            cores = sorted(os.sched_getaffinity(0))
        except AttributeError:
            cores = []
        return {"node": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid(), "cores": cores, "dumpfd": self.dumpfd}

    def start(self, env_fns: Sequence[Any], policy: Any, config: Config, seed: int, lo: int, generation: int,
              steps_done: int, weights: dict | None, cores: list[int] | None, worker_timeout: float) -> None:
        if cores:  # this actor's own cores of its node (when the node has enough for every actor)
            try:
                os.sched_setaffinity(0, cores)
            except (AttributeError, OSError):
                pass
        self.ex = SliceExecutor(list(env_fns[lo:lo + config.num_envs]), policy, config=config, seed=seed,
                                env_id_offset=lo, generation=generation, steps_done=steps_done,
                                worker_timeout=worker_timeout)
        if weights is not None:
            self.ex.set_policy_state(weights)

    def collect(self, num_steps: int) -> Any:
        assert self.ex is not None
        return self.ex.collect(num_steps)  # on an error it closes itself, then raises

    def set_policy_state(self, state: dict) -> None:
        assert self.ex is not None
        self.ex.set_policy_state(state)

    def abort(self) -> None:
        """Runs in the actor's ``control`` thread, beside a running collect: end this actor's
        worker processes so the collect fails and its executor closes (unlinking its shared
        memory) instead of waiting for workers that may never answer."""
        ex = self.ex
        if ex is not None:
            ex.kill_workers()

    def child_pids(self) -> list[int]:
        """Pids of the processes this actor started (for tests and debugging)."""
        import psutil

        return [p.pid for p in psutil.Process().children(recursive=True)]

    def close(self) -> None:
        ex, self.ex = self.ex, None
        if ex is not None:
            ex.close()  # unlinks its segments and semaphore names itself: the caller ray.kill()s us next

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


_remote_cls: Any = None


def _actor_class() -> Any:
    global _remote_cls
    if _remote_cls is None:
        import ray

        # "control": a second thread for abort(), beside the default one that runs collects
        _remote_cls = ray.remote(max_restarts=0, max_task_retries=0, concurrency_groups={"control": 1})(RayActorHost)
    return _remote_cls


def sweep_segments(pid: int, wait: float = CLOSE_SECONDS) -> int:
    """Once process ``pid`` has ended (waiting at most ``wait`` s), unlink the segments and
    named semaphores it created (``/dev/shm/auturi_<pid>_*``, ``sem.auturi_<pid>_*``); returns
    how many. Runs on the dead actor's node."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        except PermissionError:  # the pid was reused by someone else's process
            break
        time.sleep(0.05)
    n = 0
    for name in os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []:
        if name.startswith((f"auturi_{pid}_", f"sem.auturi_{pid}_")):
            try:
                os.unlink(os.path.join("/dev/shm", name))
                n += 1
            except FileNotFoundError:
                pass
    return n


_sweep_task: Any = None


def _sweeper() -> Any:
    global _sweep_task
    if _sweep_task is None:
        import ray

        _sweep_task = ray.remote(num_cpus=0, max_retries=0)(sweep_segments)
    return _sweep_task


def stack_of(pid: int, fd: int) -> tuple[str, str]:
    """:func:`channel.process_stack` of a Ray actor (runs on its node)."""
    return process_stack(pid, fd)


def _settle(refs: list, timeout: float, watch: dict | None = None, ok: set | None = None) -> None:
    """Wait (at most ``timeout`` s in all) for ``refs``, swallowing their errors (they are
    expected while closing, and Ray would log them as unhandled); ``ok`` gets
    ``watch[ref]`` for each ref in ``watch`` that succeeded."""
    import ray

    if not refs:
        return
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    for ref in ready:
        try:
            ray.get(ref, timeout=0)
        except Exception:
            continue
        if watch is not None and ok is not None and ref in watch:
            ok.add(watch[ref])


# ----------------------------------------------------------------------------- caller side
class _ProgressWatch:
    """``worker_timeout`` for Ray actors during a collect or weight update: every
    ``PROBE_SECONDS`` each busy actor is asked for its progress word (``RayActorHost.progress``,
    in its ``control`` thread); an actor whose word has not moved, or that has not answered, for
    ``worker_timeout`` seconds is stuck. An actor waiting on a stuck worker of its own keeps
    moving its word and reports that worker itself, so the innermost stuck process is named."""

    def __init__(self, ex: "RayExecutor", t0: float):
        self.ex, self.t0 = ex, t0
        self.probes: dict[int, Any] = {}
        self.seen: dict[int, int] = {}
        self.since: dict[int, float] = {}
        self.asked = 0.0

    def check(self, indices: list[int], now: float) -> None:
        import ray

        if self.probes:
            ready, _ = ray.wait(list(self.probes.values()), num_returns=len(self.probes), timeout=0)
            for i, ref in list(self.probes.items()):
                if ref in ready:
                    del self.probes[i]
                    try:
                        value = ray.get(ref)
                    except Exception:  # a dead actor: its own call fails and says why
                        continue
                    if value != self.seen.get(i):
                        self.seen[i], self.since[i] = value, now
        for i in indices:
            idle = now - self.since.setdefault(i, self.t0)
            if idle > self.ex.worker_timeout:
                self.ex._probes = list(self.probes.values())
                raise self.ex._stuck(self.ex._actors[i], idle)
        if now - self.asked >= PROBE_SECONDS:
            self.asked = now
            for i in indices:
                if i not in self.probes:
                    handle = self.ex._actors[i].handle
                    self.probes[i] = handle.progress.options(concurrency_group="control").remote()
        self.ex._probes = list(self.probes.values())


@dataclass
class _Actor:
    index: int
    handle: Any
    envs: range
    node: str = "?"
    ip: str = "?"
    pid: int = 0
    dumpfd: int = -1

    @property
    def name(self) -> str:
        return (f"ray actor {self.index} (envs {self.envs[0]}-{self.envs[-1]}) on node {self.node[:12]} "
                f"({self.ip}, pid {self.pid})")


class RayExecutor(Executor):
    """Backend ``ray``: one Ray actor per actor of the config, each running a whole
    collection loop per call on its node (see the module docstring for the layout, the
    connection rules and the failure policy).

    Args (besides the :class:`Executor` ones):
        address: ``None`` (the current connection, ``RAY_ADDRESS``, or a new local instance),
            ``"auto"``, ``"host:port"`` or ``"ray://host:port"``.
        start_timeout: seconds to wait for the cluster to place and start the actors before
            raising :class:`auturi.AuturiError`.
    """

    backend = "ray"

    def __init__(self, *args: Any, address: str | None = None, start_timeout: float = 120.0, **kwargs: Any):
        self._actors: list[_Actor] = []
        self._inflight: dict[int, Any] = {}  # actor index -> ref of its call still running
        self._probes: list = []  # progress probes still unanswered (settled at close)
        self._pg: Any = None
        self._generation = -1
        self._payload: tuple[Any, Any] | None = None
        self._weights_ref: Any = None
        self._finals: dict = {}
        self._start_timeout = float(start_timeout)
        self._applying: Config | None = None
        self._uses_local = connect(address)
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            self._close_workers()
            self._release()
            raise

    @property
    def actor_nodes(self) -> list[str]:
        """The Ray node id each actor runs on, in actor order."""
        return [a.node for a in self._actors]

    @property
    def actor_pids(self) -> list[int]:
        """The process id of each Ray actor, in actor order."""
        return [a.pid for a in self._actors]

    def validate(self, config: Config) -> None:
        # The device is checked against the cluster's GPUs, not this process's.
        super().validate(config.replace(policy_device="cpu") if isinstance(config, Config) else config)
        found = ray_cluster_resources().knob_problem(config)
        if found:
            knob, why = found
            raise ConfigError(knob, getattr(config, knob), f"the Ray cluster cannot run {config}: {why}")

    # ------------------------------------------------------------------ config
    def _apply_config(self, config: Config) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._close_workers()
        self._generation += 1
        self._applying = config
        cpus = config.processes_per_actor
        gpus = 0 if config.policy_device == "cpu" else 1
        bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
        self._pg = placement_group([bundle] * config.num_actors, strategy="SPREAD")
        ready, _ = ray.wait([self._pg.ready()], timeout=self._start_timeout)
        if not ready:
            raise AuturiError(f"the Ray cluster did not place {config.num_actors} actors of {bundle} within "
                              f"{self._start_timeout:.0f} s (cluster: {ray_cluster_resources()})")
        if self._payload is None:
            self._payload = (ray.put(self.env_fns), ray.put(self.policy))
        cls = _actor_class()
        self._actors = [
            _Actor(a, cls.options(num_cpus=cpus, num_gpus=gpus, scheduling_strategy=PlacementGroupSchedulingStrategy(
                self._pg, placement_group_bundle_index=a)).remote(), config.actor_env_ids(a))
            for a in range(config.num_actors)]
        wheres = self._wait({a.index: a.handle.where.remote() for a in self._actors}, self._start_timeout)
        for a in self._actors:
            w = wheres[a.index]
            a.node, a.ip, a.pid, a.dumpfd = w["node"], w["ip"], w["pid"], w["dumpfd"]
        # Inside an actor, a CUDA policy sees only the GPU Ray gave it.
        sub = Config(1, config.envs_per_actor, config.env_parallel_degree, config.policies_per_actor,
                     "cpu" if not gpus else "cuda", config.policy_batch_size)
        fns, policy = self._payload
        cores = self._actor_cores(wheres, cpus)
        self._wait({a.index: a.handle.start.remote(fns, policy, sub, self.seed, a.envs[0], self._generation,
                                                   self._steps_done, self._weights_ref, cores[a.index],
                                                   self.worker_timeout)
                    for a in self._actors}, self._start_timeout)

    def _actor_cores(self, wheres: dict[int, dict], cpus: int) -> dict[int, list[int] | None]:
        """Disjoint cores for the actors sharing a node, when it has enough for all of them
        (the shm backend pins its processes within the actor's cores); else no pinning."""
        by_node: dict[str, list[int]] = {}
        for i in sorted(wheres):
            by_node.setdefault(wheres[i]["node"], []).append(i)
        out: dict[int, list[int] | None] = {}
        for idx in by_node.values():
            for rank, i in enumerate(idx):
                cores = wheres[i]["cores"]
                fits = len(idx) > 1 and len(idx) * cpus <= len(cores)
                out[i] = cores[rank * cpus:(rank + 1) * cpus] if fits else None
        return out

    # ------------------------------------------------------------------ collect
    def _run_actors(self, num_steps: int) -> tuple[float, float, float]:
        parts = self._wait({a.index: a.handle.collect.remote(num_steps) for a in self._actors})
        b = self._block
        assert b is not None
        T = num_steps
        finals: dict = {}
        seconds = np.zeros(3)
        for a in self._actors:
            r, cols = parts[a.index], slice(a.envs[0], a.envs[-1] + 1)
            b["obs"][:T, cols] = r.observations
            b["obs"][T, cols] = r.last_observations
            b["starts"][:T, cols] = r.episode_starts
            b["starts"][T, cols] = r.last_episode_starts
            for k in ("actions", "rewards", "terminated", "truncated"):
                b[k][:, cols] = getattr(r, k)
            for k, v in r.extras.items():
                b["extras." + k][:, cols] = v
            finals.update({key: (r.final_observations[key], r.final_infos[key]) for key in r.final_observations})
            s = r.stats
            seconds += (s.env_seconds, s.policy_seconds, s.wait_seconds)
        self._finals = finals
        return float(seconds[0]), float(seconds[1]), float(seconds[2])

    def _gather_finals(self) -> dict:
        finals, self._finals = self._finals, {}
        return finals

    def _publish_weights(self, state: dict[str, np.ndarray], version: int) -> None:
        import ray

        self._weights_ref = ray.put(state)  # once per update, for every actor (and future ones)
        try:
            self._wait({a.index: a.handle.set_policy_state.remote(self._weights_ref) for a in self._actors})
        except BaseException:
            self.close()
            raise

    def _wait(self, refs: dict[int, Any], timeout: float | None = None) -> dict[int, Any]:
        """The results of one call per actor (actor index -> ref). Short ``ray.wait`` calls
        in a loop: the first failure raises :class:`WorkerError`, the actors' nodes are
        checked every ``LIVENESS_SECONDS``, and ``timeout`` (None: no limit, for a collect,
        whose envs may be slow) bounds the whole."""
        import ray

        by_ref = {ref: i for i, ref in refs.items()}
        pending = list(by_ref)
        self._inflight = dict(refs)
        out: dict[int, Any] = {}
        t0 = checked = time.monotonic()
        watch = _ProgressWatch(self, t0) if timeout is None else None
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=POLL_SECONDS)
            for ref in ready:
                i = by_ref[ref]
                try:
                    out[i] = ray.get(ref)
                except Exception as exc:
                    raise self._failure(self._actors[i], exc) from None
                self._inflight.pop(i, None)
            now = time.monotonic()
            if pending and now - checked > LIVENESS_SECONDS:
                checked = now
                self._check_nodes([by_ref[r] for r in pending])
            if pending and watch is not None:
                watch.check([by_ref[r] for r in pending], now)
            if pending and timeout is not None and now - t0 > timeout:
                slow = ", ".join(self._actors[by_ref[r]].name for r in pending)
                raise AuturiError(f"{slow}: no answer within {timeout:.0f} s")
        return out

    def _stuck(self, actor: _Actor, idle: float) -> WorkerError:
        """The :class:`WorkerError` for an actor that made no progress for ``idle`` seconds,
        with its stack, read on its node (here when it runs on this machine)."""
        import ray

        note, stack = "", "(its stack could not be fetched from its node)"
        if actor.ip == ray.util.get_node_ip_address():
            note, stack = process_stack(actor.pid, actor.dumpfd)
        else:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            ref = ray.remote(num_cpus=0, max_retries=0)(stack_of).options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(actor.node, soft=False)).remote(actor.pid,
                                                                                                  actor.dumpfd)
            ready, _ = ray.wait([ref], timeout=DUMP_SECONDS + CLOSE_SECONDS)
            if ready:
                note, stack = ray.get(ref)
        return WorkerError(actor.name, stuck_reason(idle, note, actor.pid, self.worker_timeout), "", self._applying,
                           stack)

    def _check_nodes(self, indices: list[int]) -> None:
        import ray

        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        for i in indices:
            a = self._actors[i]
            if a.node != "?" and a.node not in alive:
                raise WorkerError(a.name, "its Ray node is dead", "", self._applying)

    def _failure(self, actor: _Actor, exc: BaseException) -> WorkerError:
        """A :class:`WorkerError` naming the actor, its node and the cause."""
        from ray import exceptions as rex

        config = self._applying
        if isinstance(exc, rex.RayTaskError):
            cause = getattr(exc, "cause", None)
            if isinstance(cause, WorkerError):  # one of the actor's own workers failed
                return WorkerError(f"{actor.name}: {cause.worker}", cause.reason, cause.traceback, config, cause.stack)
            what = f"{type(cause).__name__}: {cause}" if cause is not None else "an exception"
            return WorkerError(actor.name, f"raised {what}", getattr(exc, "traceback_str", str(exc)), config)
        if isinstance(exc, rex.RayActorError):
            return WorkerError(actor.name, f"died ({type(exc).__name__})", str(exc), config)
        return WorkerError(actor.name, f"failed ({type(exc).__name__})", str(exc), config)

    # ------------------------------------------------------------------ close
    def _close_workers(self) -> None:
        """Idle actors close their executors; busy ones (a call still running after an
        error or Ctrl-C) first abort it by ending their workers, and close as it fails. All
        this is bounded by ``CLOSE_SECONDS``; then every actor is killed and the placement
        group removed, whatever happened before."""
        actors, self._actors = self._actors, []
        busy, self._inflight = self._inflight, {}
        probes, self._probes = self._probes, []
        pg, self._pg = self._pg, None
        if not actors and pg is None:
            return
        import ray
        from ray.util.placement_group import remove_placement_group
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        closed: set[int] = set()
        try:
            # abort runs at once in its own thread; close runs after the actor's running call
            aborts = [a.handle.abort.options(concurrency_group="control").remote() for a in actors if a.index in busy]
            closes = {a.handle.close.remote(): a.index for a in actors}
            _settle(aborts + list(closes) + list(busy.values()), CLOSE_SECONDS, closes, closed)
        finally:
            for a in actors:
                try:
                    ray.kill(a.handle, no_restart=True)
                except Exception:  # already dead
                    pass
            # A dead or killed actor could not unlink its segments (Ray ends its resource
            # tracker with it): unlink them on its node once it is gone.
            dead = [a for a in actors if a.index not in closed and a.pid]
            sweeps = [_sweeper().options(scheduling_strategy=NodeAffinitySchedulingStrategy(a.node, soft=False))
                      .remote(a.pid) for a in dead]
            _settle(sweeps + probes, CLOSE_SECONDS)
            # And here for actors on this machine, whatever became of those tasks (one was
            # seen to miss segments): the names carry the pid, so this is exact.
            here = ray.util.get_node_ip_address()
            for a in dead:
                if a.ip == here:
                    sweep_segments(a.pid)
            if pg is not None:
                try:
                    remove_placement_group(pg)
                except Exception:
                    pass

    def close(self) -> None:
        """End every Ray actor (and the processes inside them); shut down the local Ray
        instance Auturi started if no other executor uses it. Idempotent."""
        try:
            super().close()
        finally:
            self._release()

    def _release(self) -> None:
        if self._uses_local:
            self._uses_local = False
            release()
