"""The caller's side of the ``ray`` backend: :class:`RayExecutor` (see
:mod:`auturi.executor.ray` for the layout, the connection rules and the failure policy).
What each Ray actor asks for and runs is the layout plan's
(:attr:`~auturi.executor.layout.ActorPlan.ray`); nothing is recomputed here.

Over 400 lines: start-up, in-place reconfigure, collect, the progress watch (``worker_timeout``)
and the failure and close paths all read and write the same actor table, in-flight calls and
probes; the watch was a module of its own that reached into this class's state, and is merged
here for that reason. What stands alone is apart: the connection (:mod:`.cluster`), the Ray
actor's body (:mod:`.actor`), the clean-up after dead actors (:mod:`.sweep`)."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from auturi.config import Config
from auturi.errors import AuturiError, ConfigError, LostEnvChangesError, WorkerError
from auturi.executor.base import Executor
from auturi.executor.env_calls import EnvCall, first_error, read_env_call_answer
from auturi.executor.layout import plan_layout, ray_actor_cores
from auturi.executor.ray.actor import actor_class, stack_of
from auturi.executor.ray.cluster import (
    alive_node_resources,
    check_actor_resources,
    connect,
    NODE_LOST_SECONDS,
    custom_of,
    lost_node_reason,
    never_ran_hint,
    node_lost,
    ray_cluster_resources,
    release,
    unplaceable,
    with_extra,
)
from auturi.executor.ray.sweep import CLOSE_SECONDS, settle, sweep_segments, sweeper
from auturi.executor.shm.channel import DUMP_SECONDS, process_stack, stuck_reason

POLL_SECONDS = 0.2
"""Longest single ``ray.wait``; between them the caller may be interrupted."""
LIVENESS_SECONDS = 2.0
"""How often a long wait checks that the nodes of the actors it waits for are alive."""
PROBE_SECONDS = 0.5
"""How often a collect asks each busy actor for its progress (``worker_timeout``)."""


@dataclass
class _Progress:
    """What a wait watches (``worker_timeout``, :meth:`RayExecutor._watch`): per actor index, its
    unanswered progress probe, the last progress word seen and since when."""

    t0: float
    probes: dict[int, Any] = field(default_factory=dict)
    seen: dict[int, int] = field(default_factory=dict)
    since: dict[int, float] = field(default_factory=dict)
    asked: float = 0.0


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
        actor_resources: what each Ray actor asks for beyond the layout's own bundle (one CPU
            per process, a GPU for a CUDA policy): ``{"CPU": c, "GPU": g, "<custom>": x}``;
            ``CPU`` and ``GPU`` raise the bundle's to at least ``c`` and ``g``, custom
            resources are added (the RLlib face passes an EnvRunner's
            ``num_cpus_per_env_runner``, ``num_gpus_per_env_runner`` and
            ``custom_resources_per_env_runner`` here). A layout whose bundles no set of
            alive nodes can hold fails at once with :class:`auturi.ConfigError`.
    """

    backend = "ray"

    def __init__(self, *args: Any, address: str | None = None, start_timeout: float = 120.0,
                 actor_resources: Mapping[str, float] | None = None, **kwargs: Any):
        self._extra = check_actor_resources(actor_resources)
        self._actors: list[_Actor] = []
        self._inflight: dict[int, Any] = {}  # actor index -> ref of its call still running
        self._progress: _Progress | None = None  # the current wait's progress probes (settled at close)
        self._failed: set[int] = set()  # indices of actors found stuck or dead: killed first at close
        self._pg: Any = None
        self._generation = -1
        self._payload: tuple[Any, Any] | None = None
        self._weights_ref: Any = None
        self._finals: dict = {}
        self._start_timeout = float(start_timeout)
        self._applying: Config | None = None
        self._plan: Any = None
        self._cluster: Any = None  # the cluster's resources as the last validate read them
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
    def actor_places(self) -> list[dict[str, Any]]:
        """Where each actor runs, in actor order: ``{"actor", "envs": [first, last], "node"
        (Ray node id), "ip", "pid"}`` (what the faces report and the status page shows)."""
        return [{"actor": a.index, "envs": [a.envs[0], a.envs[-1]], "node": a.node, "ip": a.ip, "pid": a.pid}
                for a in self._actors]

    @property
    def actor_pids(self) -> list[int]:
        """The process id of each Ray actor, in actor order."""
        return [a.pid for a in self._actors]

    def validate(self, config: Config) -> None:
        # The device is checked against the cluster's GPUs (check_device, in knob_problem), not
        # this process's.
        super().validate(config.replace(policy_device="cpu") if isinstance(config, Config) else config)
        self._cluster = ray_cluster_resources()
        found = self._cluster.knob_problem(config)
        if found:
            knob, why = found
            raise ConfigError(knob, getattr(config, knob), f"the Ray cluster cannot run {config}: {why}")
        if self._extra:
            bundle = with_extra(plan_layout(config, cluster=self._cluster).actors[0].ray.bundle,  # type: ignore[union-attr]
                                self._extra)
            why = unplaceable(bundle, config.num_actors, alive_node_resources())
            if why:
                raise ConfigError("num_actors", config.num_actors, f"the Ray cluster cannot place {config}: {why}")

    # ------------------------------------------------------------------ config
    def _apply_config(self, config: Config) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        plan = self._plan_for(config)
        self._applying = config
        if self._actors and self._keeps_actors(self._plan, plan):
            self._reconfigure_in_place(plan)
            return
        ended = self._plan.num_processes if self._plan is not None and self._actors else 0
        self._close_workers()
        self._generation += 1
        self._plan = plan
        # every Ray actor restarts and every env is made anew (a new generation's seeds)
        self._counts = {"ended": ended, "started": plan.num_processes,
                        "recreated": self.num_envs if self._steps_done else 0}
        placements = [ap.ray for ap in plan.actors]
        bundles = [with_extra(p.bundle, self._extra) for p in placements]  # type: ignore[union-attr]
        self._pg = placement_group(bundles, strategy="SPREAD")
        ready, _ = ray.wait([self._pg.ready()], timeout=self._start_timeout)
        if not ready:
            raise AuturiError(f"the Ray cluster did not place {config.num_actors} actors of {bundles[0]} within "
                              f"{self._start_timeout:.0f} s (cluster: {ray_cluster_resources()}; other tasks may "
                              f"hold its resources): add nodes, free them, or run fewer or smaller actors")
        if self._payload is None:
            self._payload = (ray.put(self.env_fns), ray.put(self.policy))
        cls = actor_class()
        self._actors = [
            _Actor(ap.index, cls.options(num_cpus=bundles[ap.index]["CPU"], num_gpus=bundles[ap.index].get("GPU", 0),
                                         resources=custom_of(bundles[ap.index]),
                                         scheduling_strategy=PlacementGroupSchedulingStrategy(
                                             self._pg, placement_group_bundle_index=ap.index)).remote(),
                   range(ap.env_ids[0], ap.env_ids[-1] + 1))
            for ap in plan.actors]
        wheres = self._wait({a.index: a.handle.where.remote() for a in self._actors}, self._start_timeout)
        for a in self._actors:
            w = wheres[a.index]
            a.node, a.ip, a.pid, a.dumpfd = w["node"], w["ip"], w["pid"], w["dumpfd"]
        fns, policy = self._payload
        # Inside an actor a one-actor shm executor runs the plan's node config (a CUDA policy
        # sees only the GPU Ray gave it) over the cores the actors sharing its node split.
        cores = ray_actor_cores(wheres, placements[0].cpus)  # type: ignore[union-attr]
        self._wait({a.index: a.handle.start.remote(fns, policy, placements[a.index].node_config, self.seed,  # type: ignore[union-attr]
                                                   a.envs[0], self._generation, self._steps_done, self._weights_ref,
                                                   cores[a.index], self.worker_timeout, self.check_finite)
                    for a in self._actors}, self._start_timeout)

    def _plan_for(self, config: Config) -> Any:
        """``config``'s plan on the cluster (the tuner half's ``move_cost`` diffs two)."""
        return plan_layout(config, cluster=self._cluster or ray_cluster_resources())

    def _processes_started(self, old: Any, new: Any) -> tuple:
        """Every process of ``new`` when the Ray actors restart, else those the actors'
        own executors start (:meth:`_keeps_actors`)."""
        return old.diff(new).started if self._keeps_actors(old, new) else new.processes

    def _keeps_actors(self, old: Any, plan: Any) -> bool:
        """Whether every Ray actor of plan ``old`` keeps its role in ``plan`` (the layout
        diff's: same envs, device, threads) and its bundle. All or none: the actors share one
        placement group, and Ray cannot resize a bundle under a running actor (a change of
        processes per actor or of GPU restarts them all)."""
        if old is None or len(old.actors) != len(plan.actors):
            return False
        kept = {n.actor for o, n in old.diff(plan).kept if n.kind == "actor" and o.actor == n.actor}
        return all(n.index in kept and with_extra(o.ray.bundle, self._extra) == with_extra(n.ray.bundle, self._extra)
                   for o, n in zip(old.actors, plan.actors))

    def _reconfigure_in_place(self, plan: Any) -> None:
        """Each kept Ray actor reconfigures its own executor to its new node config (which
        keeps its processes and moves its envs live, as ``shm`` does); envs one recreates are
        seeded from this executor's generation, so every actor stays on the whole's."""
        done = self._wait({a.index: a.handle.reconfigure.remote(plan.actors[a.index].ray.node_config,
                                                                self._generation)
                           for a in self._actors}, self._start_timeout)
        self._plan = plan
        self._generation = max(d["generation"] for d in done.values())
        counts = {k: sum(int(d[k]) for d in done.values()) for k in ("kept", "started", "ended", "moved", "recreated")}
        counts["kept"] += len(self._actors)  # the Ray actors' own processes
        self._counts = counts

    def _refuse_lost_changes(self, config: Config) -> None:
        """Envs a call changed keep the change only while their Ray actors stay: a layout
        that restarts them (:meth:`_keeps_actors`) makes every env anew, so it is refused; an
        in-place one is checked by each actor holding such envs against its own moves."""
        plan = self._plan_for(config)
        touched = sorted(e + self.env_id_offset for e in self._touched)
        if not (self._actors and self._keeps_actors(self._plan, plan)):
            raise LostEnvChangesError(touched, "this layout restarts the Ray actors (another actor count, processes "
                                              "per actor or device), and a Ray actor's envs are made anew in the "
                                              "actor that follows it")
        asked = {a.index: a.handle.check_moves.remote(plan.actors[a.index].ray.node_config)
                 for a in self._actors if self._touched & set(a.envs)}
        try:
            found = [e for _, e in sorted(self._wait(asked, self._start_timeout).items()) if e is not None]
        except BaseException:
            self.close()
            raise
        if found:
            raise found[0]  # an actor's LostEnvChangesError (global env indices), nothing changed yet

    def _call_envs(self, call: EnvCall) -> dict[int, Any]:
        """Each Ray actor holding some of ``call.ids`` runs its share through its own
        executor (ids local to it; the request and the answer pickled); errors are raised
        once all have answered. A failed actor (not an env's exception) closes the executor."""
        import cloudpickle

        parts: dict[int, list[int]] = {}  # actor index -> positions in call.ids
        for p, i in enumerate(call.ids):
            for a in self._actors:
                if i in a.envs:
                    parts.setdefault(a.index, []).append(p)
        refs = {}
        for k, positions in parts.items():
            lo = self._actors[k].envs[0]
            sub = dataclasses.replace(call, ids=tuple(call.ids[p] - lo for p in positions))
            refs[k] = self._actors[k].handle.env_call.remote(cloudpickle.dumps(sub))
        try:
            answers = self._wait(refs)
        except BaseException:
            self.close()
            raise
        results: dict[int, Any] = {}
        errors: list[BaseException] = []
        for k, answer in answers.items():
            try:
                got, _ = read_env_call_answer(answer)  # travel checks: each actor's executor checks its own moves
            except Exception as e:
                if isinstance(e, WorkerError) or not isinstance(e, AuturiError):  # the actor's executor failed
                    self.close()
                    raise
                errors.append(e)
                continue
            results.update({parts[k][p]: v for p, v in got.items()})
        if errors:
            raise first_error(call, errors, self.env_id_offset)
        return results

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
        progress = None
        if timeout is None:  # a collect or weight update: watched (its probes are settled at close)
            progress = self._progress = _Progress(t0)
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
            if pending and progress is not None:
                self._watch(progress, [by_ref[r] for r in pending], now)
            if pending and timeout is not None and now - t0 > timeout:
                slow = ", ".join(self._actors[by_ref[r]].name for r in pending)
                raise AuturiError(f"{slow}: no answer within {timeout:.0f} s")
        return out

    def _watch(self, progress: _Progress, indices: list[int], now: float) -> None:
        """``worker_timeout`` for the Ray actors ``indices`` a collect or weight update waits
        on: every ``PROBE_SECONDS`` each is asked for its progress word
        (``RayActorHost.progress``, in its ``control`` thread); one whose word has not moved,
        or that has not answered, for ``worker_timeout`` seconds is stuck (:meth:`_stuck`). An
        actor waiting on a stuck worker of its own keeps moving its word and reports that
        worker itself, so the innermost stuck process is named."""
        import ray

        if progress.probes:
            ready, _ = ray.wait(list(progress.probes.values()), num_returns=len(progress.probes), timeout=0)
            for i, ref in list(progress.probes.items()):
                if ref in ready:
                    del progress.probes[i]
                    try:
                        value = ray.get(ref)
                    except Exception:  # a dead actor: its own call fails and says why
                        continue
                    if value != progress.seen.get(i):
                        progress.seen[i], progress.since[i] = value, now
        for i in indices:
            idle = now - progress.since.setdefault(i, progress.t0)
            if idle > self.worker_timeout:
                raise self._stuck(self._actors[i], idle)
        if now - progress.asked >= PROBE_SECONDS:
            progress.asked = now
            for i in indices:
                if i not in progress.probes:
                    progress.probes[i] = self._actors[i].handle.progress.options(concurrency_group="control").remote()

    def _stuck(self, actor: _Actor, idle: float) -> WorkerError:
        """The :class:`WorkerError` for an actor that made no progress for ``idle`` seconds,
        with its stack, read on its node (here when it runs on this machine)."""
        import ray

        self._failed.add(actor.index)
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
                raise WorkerError(a.name, lost_node_reason(a.node, a.ip), "", self._applying)

    def _failure(self, actor: _Actor, exc: BaseException) -> WorkerError:
        """A :class:`WorkerError` naming the actor, its node and the cause."""
        from ray import exceptions as rex

        self._failed.add(actor.index)
        config = self._applying
        if isinstance(exc, rex.RayTaskError):
            cause = getattr(exc, "cause", None)
            if isinstance(cause, WorkerError):  # one of the actor's own workers failed
                return WorkerError(f"{actor.name}: {cause.worker}", cause.reason, cause.traceback, config, cause.stack)
            what = f"{type(cause).__name__}: {cause}" if cause is not None else "an exception"
            return WorkerError(actor.name, f"raised {what}", getattr(exc, "traceback_str", str(exc)), config)
        if isinstance(exc, rex.RayActorError):
            # A lost node first shows as an actor whose socket closed (unavailable, not yet
            # dead): wait, bounded, for the GCS's verdict on the node to say which it was.
            wait = NODE_LOST_SECONDS if isinstance(exc, rex.ActorUnavailableError) else 0.0
            if actor.node != "?" and node_lost(actor.node, wait):
                return WorkerError(actor.name, lost_node_reason(actor.node, actor.ip), str(exc), config)
            hint = never_ran_hint(str(exc)) if not actor.pid else ""  # pid 0: it never answered
            return WorkerError(actor.name, f"died ({type(exc).__name__}){hint}", str(exc), config)
        return WorkerError(actor.name, f"failed ({type(exc).__name__})", str(exc), config)

    # ------------------------------------------------------------------ close
    def _close_workers(self) -> None:
        """Idle actors close their executors; busy ones (a call still running after an
        error or Ctrl-C) first abort it by ending their workers, and close as it fails. All
        this is bounded by ``CLOSE_SECONDS``; then every actor is killed and the placement
        group removed, whatever happened before. An actor found stuck or dead is killed first
        and not waited for: a stopped one never answers, and waiting the whole
        ``CLOSE_SECONDS`` for it held its ``WorkerError`` back 10 s."""
        actors, self._actors = self._actors, []
        failed, self._failed = self._failed, set()
        busy, self._inflight = self._inflight, {}
        progress, self._progress = self._progress, None
        probes = list(progress.probes.values()) if progress is not None else []
        pg, self._pg = self._pg, None
        if not actors and pg is None:
            return
        import ray
        from ray.util.placement_group import remove_placement_group
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        closed: set[int] = set()
        try:
            for a in actors:
                if a.index in failed:
                    try:
                        ray.kill(a.handle, no_restart=True)
                    except Exception:  # already dead
                        pass
            live = [a for a in actors if a.index not in failed]
            # abort runs at once in its own thread; close runs after the actor's running call
            aborts = [a.handle.abort.options(concurrency_group="control").remote() for a in live if a.index in busy]
            closes = {a.handle.close.remote(): a.index for a in live}
            settle(aborts + list(closes) + [r for i, r in busy.items() if i not in failed], CLOSE_SECONDS, closes,
                   closed)
        finally:
            for a in actors:
                try:
                    ray.kill(a.handle, no_restart=True)
                except Exception:  # already dead
                    pass
            # A dead or killed actor could not unlink its segments (Ray ends its resource
            # tracker with it): unlink them on its node once it is gone.
            dead = [a for a in actors if a.index not in closed and a.pid]
            sweeps = [sweeper().options(scheduling_strategy=NodeAffinitySchedulingStrategy(a.node, soft=False))
                      .remote(a.pid) for a in dead]
            settle(sweeps + probes, CLOSE_SECONDS)
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
