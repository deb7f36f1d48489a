"""Where everything of a :class:`~auturi.Config` runs: one pure function, :func:`plan_layout`,
from ``(config, cores, cluster)`` to a :class:`LayoutPlan`.

Just over 400 lines on purpose: the one place a config becomes processes, shares, pins,
threads and loops; split, the rules that must agree (pins and threads, shares and hosts)
would live apart.

Per actor the plan says which envs it owns, how they are split in shares and which process
steps each share, its policy replicas and where they run, which loop it runs (lockstep,
overlapped or general), and, per process it starts, the cores the process is pinned to and
the torch threads it sets. The rules are the ones the backends apply (and must keep
applying, so that a plan read instead of recomputed changes nothing):

- ``shm`` (``cluster=None``): with one actor the actor runs in the caller's process
  ("main"); with more, each actor is a process. The actor's own process steps share 0 of its
  envs and ``env_parallel_degree - 1`` env worker processes step the others. With one replica
  inference runs in the actor's process, else in ``policies_per_actor`` replica processes.
  Over the sorted usable ``cores`` (``n`` of them) every env-stepping process (an actor's
  own process, or main during a collect when it has env workers, and each env worker) is
  pinned to one core, spread by :func:`lane_cores`: actor by actor, the actor's process
  goes to a core with the fewest such processes (among those, the fewest actor processes,
  then the lowest), and its env workers to the following cores with the fewest, none twice
  for one actor until it has used every core. Every core thus holds as many lanes as any
  other, give or take one, an actor's lanes sit on distinct cores while it has no more
  than ``n``, and actor processes (which also run a one-replica policy) on distinct cores
  while there are no more than ``n``. Replicas are not pinned. A CPU replica
  process (and an actor process running its own policy) sets
  ``max(1, (n - env workers) // replicas)`` torch threads, counted over all actors; a CUDA
  one sets 1; main's threads are the caller's and are left alone. An actor process that
  runs its own CPU policy is pinned to its lane's core plus an equal run of the cores no
  lane is pinned to (:func:`_policy_cores`), so those threads have cores to run on.
- ``ray`` (``cluster`` given): actor ``a`` is a Ray actor asking for one bundle of
  ``Config.processes_per_actor`` CPUs (and one GPU for a CUDA policy); inside it a one-actor
  ``shm`` executor runs the sub-config :attr:`RayPlacement.node_config` (device ``cuda``:
  Ray shows the actor only its GPU) by the rules above, over the cores that actor may use.
  Those are known once Ray placed the actors (:func:`ray_actor_cores`); until then the
  plan's pins and CPU thread counts are ``None``.
- ``serial``: no process at all; its loops read only the shares, replicas and batch size.

Process names and their order are the ``shm`` backend's (its control block slots): all
actor processes first, then per actor its env workers, then its replicas.

:meth:`LayoutPlan.diff` compares two plans: which processes keep their role, which start
and end, which envs move; what a reconfigure needs to keep live processes.

Example:
    >>> from auturi import Config
    >>> p = plan_layout(Config(envs_per_actor=8, env_parallel_degree=2), cores=[0, 1])
    >>> [(s.process, s.env_ids) for s in p.actors[0].env_shares]
    [('main', (0, 1, 2, 3)), ('env worker 1 of actor 0 (envs 4-7)', (4, 5, 6, 7))]
    >>> [(q.kind, q.cpus) for q in p.processes], p.main.cpus, p.actors[0].lockstep
    ([('env', (1,))], (0,), True)
    >>> d = p.diff(plan_layout(Config(envs_per_actor=8, env_parallel_degree=4), cores=[0, 1]))
    >>> print(d.summary())
    processes kept 0, started 3, ended 1; envs moved 6
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Union

from auturi.config import Config
from auturi.resources import usable_cores, usable_cores_set

if TYPE_CHECKING:
    from auturi.resources import ClusterResources

MAIN = "main"
"""Name of the caller's process in a plan."""

Cores = Union[Sequence[int], Mapping[int, Sequence[int]], None]


@dataclass(frozen=True)
class ProcessPlan:
    """One process: the caller's (``kind == "main"``) or one a backend starts."""

    kind: str
    """``main`` (the caller), ``actor``, ``env`` (env worker) or ``policy`` (replica)."""
    name: str
    """The backend's name for it (``shm``: the slot name; processes are ``auturi: <name>``)."""
    actor: int | None
    """The actor it belongs to (None: main when actors are processes of their own)."""
    env_ids: tuple[int, ...] = ()
    """Global ids of the envs it builds and steps."""
    owns: tuple[int, ...] = ()
    """For a process that runs an actor's loop: every env of that actor."""
    replica: int | None = None
    """The replica index of the policy it runs (0 for an actor's own, local policy)."""
    device: str | None = None
    """Device of the policy it runs; None when it runs none."""
    threads: int | None = None
    """Torch threads it sets; None: left as they are (main), or not known before placement."""
    cpus: tuple[int, ...] | None = ()
    """Cores it is pinned to; ``()``: not pinned; None: not known before Ray places it."""

    @property
    def role(self) -> tuple:
        """What it does, as :meth:`LayoutPlan.diff` compares it (its pins are not part of it)."""
        if self.kind == "env":
            return ("env", self.env_ids)
        if self.kind == "policy":
            return ("policy", self.actor, self.replica, self.device, self.threads)
        return (self.kind, self.actor, self.owns, self.device, self.threads)


@dataclass(frozen=True)
class EnvShare:
    """Envs one place steps in turn: ``env_ids`` stepped by the process named ``process``."""

    process: str
    env_ids: tuple[int, ...]


@dataclass(frozen=True)
class ReplicaPlan:
    """One policy replica of an actor, and the process it runs in."""

    index: int
    process: str
    device: str
    threads: int | None


@dataclass(frozen=True)
class RayPlacement:
    """What a Ray actor asks the cluster for, and the config its node runs."""

    cpus: int
    """CPUs of its bundle: one per process (``Config.processes_per_actor``)."""
    gpus: int
    """GPUs of its bundle: 1 for a CUDA policy, else 0."""
    node_config: Config
    """The one-actor config the Ray actor's own ``shm`` executor runs over its envs."""

    @property
    def bundle(self) -> dict[str, int]:
        """The placement-group bundle: ``{"CPU": cpus}`` plus ``"GPU"`` when it needs one."""
        return {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {})}


@dataclass(frozen=True)
class ActorPlan:
    """One actor: its envs, where each share steps, its replicas, its loop."""

    index: int
    env_ids: tuple[int, ...]
    """Global ids of every env it owns (``Config.actor_env_ids``)."""
    host: str
    """Name of the process running its loop (``main``, ``actor a ...`` or ``ray actor a ...``)."""
    env_shares: tuple[EnvShare, ...]
    """``env_parallel_degree`` equal shares in env order; share 0 is stepped by ``host``."""
    replicas: tuple[ReplicaPlan, ...]
    """``policies_per_actor`` replicas; a lone one runs in ``host``."""
    batch_size: int
    """The most observations one forward pass takes."""
    lockstep: bool
    """True when the loop steps every env row by row (one in-process replica acting for all
    envs at once: ``ActorLoop``'s lockstep path, and the shm ``RowGroup`` for env workers)."""
    processes: tuple[ProcessPlan, ...]
    """The processes started for it: its own (if any), its env workers, its replicas."""
    ray: RayPlacement | None = None
    """On the ``ray`` backend: its bundle and node config; None elsewhere."""
    overlap: bool = False
    """True when the loop overlaps env stepping with inference (``ActorLoop``'s overlapped
    loop): a policy on a device (not ``cpu``), env workers, and not lockstep."""

    @property
    def local_policy(self) -> bool:
        """True when inference runs in the actor's own process (one replica)."""
        return len(self.replicas) == 1 and self.replicas[0].process == self.host

    @property
    def envs_per_share(self) -> int:
        return len(self.env_shares[0].env_ids)


@dataclass(frozen=True)
class EnvMove:
    """An env that a reconfigure moves: stepped by ``source`` before, by ``target`` after."""

    env_id: int
    source: str
    target: str


@dataclass(frozen=True)
class LayoutDiff:
    """What changes from one plan to another (see :meth:`LayoutPlan.diff`)."""

    kept: tuple[tuple[ProcessPlan, ProcessPlan], ...]
    """``(old, new)`` for every started process whose role is unchanged: it can stay alive."""
    started: tuple[ProcessPlan, ...]
    """Processes of the new plan with no counterpart in the old."""
    ended: tuple[ProcessPlan, ...]
    """Processes of the old plan with no counterpart in the new."""
    moved: tuple[EnvMove, ...]
    """Envs stepped by another process after (main and kept processes count as the same)."""
    main_changed: bool
    """The caller's own part changed (the actor it hosts, its local policy's device): it is
    never restarted, so this is done in place."""

    @property
    def repinned(self) -> tuple[tuple[ProcessPlan, ProcessPlan], ...]:
        """Kept processes whose cores change."""
        return tuple((o, n) for o, n in self.kept if o.cpus != n.cpus)

    @property
    def unchanged(self) -> bool:
        return not (self.started or self.ended or self.moved or self.main_changed or self.repinned)

    def summary(self) -> str:
        """One line for logs and the tuner's record."""
        return (f"processes kept {len(self.kept)}, started {len(self.started)}, ended {len(self.ended)}; "
                f"envs moved {len(self.moved)}")


@dataclass(frozen=True)
class LayoutPlan:
    """Everything :func:`plan_layout` decided for one config (see the module docstring)."""

    config: Config
    backend: str
    """``shm`` (this machine; also what ``serial`` reads) or ``ray``."""
    cores: tuple[int, ...]
    """The sorted cores the ``shm`` pins index into (``()`` for ``ray``)."""
    main: ProcessPlan
    """The caller's process: the actor it hosts (one ``shm`` actor), else nothing."""
    actors: tuple[ActorPlan, ...]

    @property
    def processes(self) -> tuple[ProcessPlan, ...]:
        """Every process the backend starts, in its order (``shm``: the slot order)."""
        own = tuple(p for a in self.actors for p in a.processes if p.name == a.host)
        return own + tuple(p for a in self.actors for p in a.processes if p.name != a.host)

    @property
    def num_processes(self) -> int:
        """Processes started besides the caller's (``shm``: ``Config.num_processes``; ``ray``:
        ``num_actors * Config.processes_per_actor``, the Ray actors included)."""
        return sum(len(a.processes) for a in self.actors)

    @property
    def busy_processes(self) -> int:
        """Processes that step envs or run a policy during a collect, main included when it
        hosts an actor (the tuner's model counts these against the cores)."""
        return self.num_processes + (self.main.actor is not None)

    def env_process(self) -> dict[int, str]:
        """Env id -> name of the process that steps it."""
        return {e: s.process for a in self.actors for s in a.env_shares for e in s.env_ids}

    def diff(self, other: "LayoutPlan") -> LayoutDiff:
        """How to go from this plan to ``other`` keeping what can be kept.

        A started process keeps its role in ``other`` when one there has the same kind and
        the same env ids (env worker), the same actor and replica index (replica) or actor
        and owned envs (actor), and the same policy device and torch threads: it may stay
        alive (:attr:`LayoutDiff.repinned` lists those whose cores change). Every env whose
        stepping process is not the same (or kept) process in ``other`` is a move; envs
        found in only one of the plans are not moves."""
        new_by_role = {p.role: p for p in other.processes}
        kept, ended = [], []
        for p in self.processes:
            q = new_by_role.pop(p.role, None)
            (kept.append((p, q)) if q is not None else ended.append(p))
        started = tuple(p for p in other.processes if p.role in new_by_role)
        same = {o.name: n.name for o, n in kept}
        same[MAIN] = MAIN
        after = other.env_process()
        moved = tuple(EnvMove(e, src, after[e]) for e, src in sorted(self.env_process().items())
                      if e in after and same.get(src) != after[e])
        return LayoutDiff(tuple(kept), started, tuple(ended), moved, self.main.role != other.main.role)


# ----------------------------------------------------------------------------- the rules
def policy_threads(config: Config, num_cores: int | None) -> int | None:
    """Torch threads of each replica process: 1 on a GPU; on the CPU, the cores env workers
    leave free shared by all replicas of all actors (at least 1). None if the cores are unknown."""
    if config.policy_device != "cpu":
        return 1
    if num_cores is None:
        return None
    env_procs = config.num_actors * (config.env_parallel_degree - 1)
    replicas = config.num_actors * config.policies_per_actor
    return max(1, (num_cores - env_procs) // replicas)


def lane_cores(actors: int, degree: int, n: int) -> list[list[int]]:
    """For each of ``actors`` actors, the core index (into ``n`` cores) of each of its
    ``degree`` env lanes (lane 0 is the actor's own process), spread as the module docstring
    says. Spreading matters on a machine with more cores than actors: pinning actor ``a``'s
    lanes to the cores after core ``a`` (this module's rule until 2026-11-27) put 8 actors x
    2 lanes on 9 of 16 cores, two lanes on most of them.

    Example:
        >>> lane_cores(8, 2, 16)[:3], lane_cores(2, 2, 2)
        ([[0, 1], [2, 3], [4, 5]], [[0, 1], [1, 0]])
    """
    lanes, hosts, out = [0] * n, [0] * n, []
    for _ in range(actors):
        first = min(range(n), key=lambda i: (lanes[i], hosts[i], i))
        lanes[first] += 1
        hosts[first] += 1
        mine, used = [first], {first}
        for _w in range(1, degree):
            if len(used) == n:  # every core has one of this actor's lanes: start another round
                used = set()
            core = min((i for i in range(n) if i not in used), key=lambda i: (lanes[i], (i - first) % n))
            lanes[core] += 1
            mine.append(core)
            used.add(core)
        out.append(mine)
    return out


def _policy_cores(config: Config, cores: tuple[int, ...], spread: list[list[int]]) -> list[tuple[int, ...]]:
    """For each actor process that runs its own CPU policy (several actors, one replica
    each), the cores no lane is pinned to, shared out in equal runs: its torch threads
    (:func:`policy_threads` counts these cores) run there beside its own lane's core. A
    process pinned to its lane's core alone would run all its threads on that one core, so
    its thread rule would keep 1 whatever the machine (2 actors x 1 lane on 16 cores: 8
    threads planned, 1 core). Empty runs when the lanes fill the cores (every 2-core plan) or
    the policy is on a device."""
    A = config.num_actors
    if config.policy_device != "cpu" or config.policies_per_actor > 1:
        return [()] * A
    taken = {c for lanes in spread for c in lanes}
    free = [c for c in cores if c not in taken]
    k = len(free) // A
    return [tuple(free[a * k:(a + 1) * k]) for a in range(A)]


def _actor_plan(config: Config, a: int, host: ProcessPlan, lanes: Sequence[int] | None,
                threads: int | None, label: str) -> ActorPlan:
    """Actor ``a`` of ``config`` whose loop runs in ``host``; ``label`` names it in its
    workers' names ("actor a" or "ray actor a"); env worker ``w`` is pinned to core
    ``lanes[w]`` (None: not known yet); replica processes set ``threads``."""
    ids = tuple(config.actor_env_ids(a))
    k, dev = config.envs_per_worker, config.policy_device
    shares, workers = [EnvShare(host.name, ids[:k])], []
    for w in range(1, config.env_parallel_degree):  # share 0 is the actor's
        share = ids[w * k:(w + 1) * k]
        name = f"env worker {w} of {label} (envs {share[0]}-{share[-1]})"
        workers.append(ProcessPlan("env", name, a, share, cpus=None if lanes is None else (lanes[w],)))
        shares.append(EnvShare(name, share))
    if config.policies_per_actor == 1:
        replicas = (ReplicaPlan(0, host.name, dev, host.threads),)
    else:
        for r in range(config.policies_per_actor):
            workers.append(ProcessPlan("policy", f"policy replica {r} of {label} (envs {ids[0]}-{ids[-1]}) on {dev}",
                                       a, replica=r,
                                       device=dev, threads=threads))
        replicas = tuple(ReplicaPlan(p.replica, p.name, dev, threads) for p in workers if p.kind == "policy")
    own = (host,) if host.kind != "main" else ()
    lockstep = config.policies_per_actor == 1 and config.policy_batch_size >= len(ids)
    return ActorPlan(a, ids, host.name, tuple(shares), replicas, config.policy_batch_size,
                     lockstep=lockstep, processes=own + tuple(workers),
                     overlap=not lockstep and config.env_parallel_degree > 1 and dev != "cpu")


def _host(kind: str, name: str, config: Config, a: int, threads: int | None,
          cpus: tuple[int, ...] | None) -> ProcessPlan:
    """The process running actor ``a``'s loop; with one replica it runs the policy too."""
    local = config.policies_per_actor == 1
    return ProcessPlan(kind, name, a, tuple(config.actor_env_ids(a))[:config.envs_per_worker],
                       owns=tuple(config.actor_env_ids(a)), replica=0 if local else None,
                       device=config.policy_device if local else None, threads=threads if local else None,
                       cpus=cpus)


def _shm_plan(config: Config, cores: tuple[int, ...], count: int | None = None) -> LayoutPlan:
    """``cores``: the ids processes are pinned to; ``count``: how many cores' worth of time
    they share (default: as many as ``cores``; fewer under a cgroup CPU quota)."""
    threads = policy_threads(config, len(cores) if count is None else count)
    spread = [[cores[i] for i in lanes]
              for lanes in lane_cores(config.num_actors, config.env_parallel_degree, len(cores))]
    if config.num_actors == 1:
        main = _host("main", MAIN, config, 0, None, (spread[0][0],) if config.env_parallel_degree > 1 else ())
        return LayoutPlan(config, "shm", cores, main, (_actor_plan(config, 0, main, spread[0], threads, "actor 0"),))
    extra = _policy_cores(config, cores, spread)
    actors = []
    for a in range(config.num_actors):
        ids = config.actor_env_ids(a)
        host = _host("actor", f"actor {a} (envs {ids[0]}-{ids[-1]})", config, a, threads,
                     (spread[a][0], *extra[a]))
        actors.append(_actor_plan(config, a, host, spread[a], threads, f"actor {a}"))
    return LayoutPlan(config, "shm", cores, ProcessPlan("main", MAIN, None), tuple(actors))


def _ray_plan(config: Config, cores: Cores) -> LayoutPlan:
    gpus = 0 if config.policy_device == "cpu" else 1
    node = Config(1, config.envs_per_actor, config.env_parallel_degree, config.policies_per_actor,
                  "cpu" if not gpus else "cuda", config.policy_batch_size)
    placement = RayPlacement(config.processes_per_actor, gpus, node)
    on_node = config.replace(policy_device=node.policy_device)  # Ray shows the actor only its GPU
    actors = []
    for a in range(config.num_actors):
        own = _actor_cores(cores, a)
        ids = config.actor_env_ids(a)
        # The Ray actor's process is its one-actor executor's main: pinned to its lane 0's core
        # when it has env workers, its threads left alone; its env workers on the next cores.
        lanes = None if own is None else [own[i] for i in lane_cores(1, config.env_parallel_degree, len(own))[0]]
        pin = None if lanes is None else ((lanes[0],) if config.env_parallel_degree > 1 else ())
        host = _host("actor", f"ray actor {a} (envs {ids[0]}-{ids[-1]})", on_node, a, None, pin)
        threads = policy_threads(node, None if own is None else len(own))
        plan = _actor_plan(on_node, a, host, lanes, threads, f"ray actor {a}")
        actors.append(replace(plan, ray=placement))
    return LayoutPlan(config, "ray", (), ProcessPlan("main", MAIN, None), tuple(actors))


def _actor_cores(cores: Cores, a: int) -> tuple[int, ...] | None:
    if cores is None:
        return None
    own = cores.get(a) if isinstance(cores, Mapping) else cores
    return None if own is None else tuple(sorted(own))


def plan_layout(config: Config, cores: Cores = None, cluster: "ClusterResources | None" = None) -> LayoutPlan:
    """The plan of ``config`` (see the module docstring for the rules).

    Args:
        config: the layout.
        cores: ``shm``: the usable core ids (default: this process's affinity, the only part
            read from the machine; pass them and the function is pure). ``ray``: each Ray
            actor's cores, ``{actor: cores}`` (:func:`ray_actor_cores`) or one sequence for
            every actor; None while unknown (pins and CPU thread counts are then None).
        cluster: the Ray cluster's resources: plan for the ``ray`` backend. It does not change
            the plan; whether the config fits is ``ClusterResources.problem``'s to say.

    Raises:
        ValueError: ``cores`` is empty, or a mapping for the ``shm`` backend.
    """
    if cluster is not None:
        if cores is not None and not isinstance(cores, Mapping) and not len(cores):
            raise ValueError("cores is empty: pass the cores each Ray actor may use, or None while unknown")
        return _ray_plan(config, cores)
    if isinstance(cores, Mapping):
        raise ValueError("cores per actor are for the ray backend (cluster=...); for shm pass one sequence of "
                         "core ids, or None for this process's affinity")
    own = tuple(sorted(set(usable_cores_set() if cores is None else cores)))
    if not own:
        raise ValueError("cores is empty: pass the core ids this process may use, or None for its affinity")
    # Read from the machine: the replicas' threads share what a cgroup's CPU quota allows,
    # not every core of the affinity mask (a container's mask lists the host's).
    return _shm_plan(config, own, usable_cores() if cores is None else None)


def ray_actor_cores(wheres: Mapping[int, Mapping[str, Any]], cpus: int) -> dict[int, list[int] | None]:
    """Disjoint cores for the Ray actors sharing a node, when it has enough for all of them
    (``cpus`` each), else None (no pinning). ``wheres``: actor index -> ``{"node": id,
    "cores": that actor's sorted affinity}``, as each Ray actor reports it."""
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
