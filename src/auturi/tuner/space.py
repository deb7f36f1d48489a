"""The search space: every valid :class:`~auturi.Config` for a workload on this machine.

The total number of envs is fixed by default, because changing it changes the learning
algorithm (batch size, sample correlation); a range of totals is opt-in. Points that are
valid configs but make no sense here are *pruned*, and each keeps the reason, so the CLI and
the results file can say why a layout was never tried.

Knob values:
- ``num_actors``: divisors of the total (each actor owns the same number of envs);
- ``env_parallel_degree``: divisors of ``envs_per_actor`` (the Config rule);
- ``policies_per_actor`` and ``policy_batch_size``: divisors of ``envs_per_actor``, with
  ``policies * batch <= envs_per_actor`` (a replica beyond ``envs / batch`` could never get a
  full batch, so it would only add a process).

Example:
    >>> from auturi.tuner.space import build_space
    >>> s = build_space(8, cores=2, devices=["cpu"])
    >>> len(s.configs) > 0 and all(c.num_envs == 8 for c in s.configs)
    True
    >>> s.summary().startswith(f"{len(s.configs)} configs")
    True
"""
from __future__ import annotations

import math
import operator
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from auturi.config import Config
from auturi.errors import ConfigError
from auturi.resources import ClusterResources, check_device, usable_cores
from auturi.resources import ray_cluster_resources  # noqa: F401 - re-exported, for build_space(cluster=...)
from auturi.resources import cuda_device_count as _cuda_device_count  # a module name tests patch

#: A config with more processes than this many times the usable cores is pruned: beyond it
#: the processes only time-slice, and start-up alone costs seconds per trial. Env-stepping
#: processes of an env that mostly waits (a remote simulator) count by their CPU share, down
#: to ``MIN_ENV_CPU_SHARE``: they hold no core while they wait.
MAX_PROCESSES_PER_CORE = 4
MIN_ENV_CPU_SHARE = 0.25
#: CUDA replicas per GPU beyond which a config is pruned: each holds its own CUDA context
#: (hundreds of MB of GPU memory) and kernels from many processes only time-slice.
MAX_CUDA_REPLICAS = 8
#: The knobs that split one actor's envs (each a divisor of envs_per_actor): all but the
#: actor count, the envs per actor and the device, in Config's order.
SHARE_KNOBS = tuple(k for k in Config.knob_names() if k not in ("num_actors", "envs_per_actor", "policy_device"))

Pruned = tuple[Config | dict, str]


def divisors(n: int) -> list[int]:
    """Sorted divisors of ``n`` (``n >= 1``)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def available_devices() -> list[str]:
    """``["cpu"]`` plus ``"cuda"`` when torch sees a GPU."""
    return ["cpu"] + (["cuda"] if _cuda_device_count() > 0 else [])


def _device_problem(device: str, cuda_count: int) -> str | None:
    """Why ``device`` cannot run here (:func:`~auturi.resources.check_device`'s rule), or None."""
    try:
        check_device(device, cuda_count)
    except ConfigError as e:
        return f"cuda unavailable: {e.rule}"
    return None


def _reason_kind(reason: str) -> str:
    """The reason with its numbers blanked, to count pruned points by kind."""
    return re.sub(r"\s*\(\d+(; [^)]*)?\)", "", reason.split(":")[0])


@dataclass
class SearchSpace:
    """Valid configs (``configs``) and pruned points with their reason (``pruned``).

    ``configs`` are in a fixed, deterministic order (by total, then actors, degree, replicas,
    batch and device); the grid strategy walks them in that order. :func:`build_space`
    makes one; a :class:`~auturi.Tuner` takes it as ``space=`` to search only part of it.

    >>> import auturi
    >>> space = auturi.build_space(4, cores=2, devices=["cpu"])
    >>> len(space), space.values("num_actors")
    (25, [1, 2, 4])
    >>> auturi.Config.serial(4) in space, space.index(auturi.Config.serial(4)) < len(space)
    (True, True)
    >>> no_full_batch = auturi.Config(envs_per_actor=4, policies_per_actor=2, policy_batch_size=4)
    >>> no_full_batch in space
    False
    >>> space.reason_pruned(no_full_batch)
    'policies_per_actor*policy_batch_size (8) > envs_per_actor (4): a replica could never get a full batch'
    """

    totals: tuple[int, ...]
    """The totals of envs the space covers (one, unless a range was asked for)."""
    cores: int
    """Usable cores the pruning rules assumed."""
    devices: tuple[str, ...]
    """Devices asked for (pruned ones included)."""
    configs: list[Config] = field(default_factory=list)
    """Every config worth measuring."""
    pruned: list[Pruned] = field(default_factory=list)
    """``(config or knob dict, reason)`` for every point left out."""
    env_cpu_fraction: float = 1.0
    """The env's computing share the process cap assumed (:func:`weighted_processes`)."""

    def __post_init__(self) -> None:
        self._index = {c: i for i, c in enumerate(self.configs)}

    def __len__(self) -> int:
        return len(self.configs)

    def __iter__(self) -> Iterator[Config]:
        return iter(self.configs)

    def __contains__(self, config: object) -> bool:
        return config in self._index

    def index(self, config: Config) -> int:
        """Position of ``config`` in ``configs`` (ValueError if absent)."""
        try:
            return self._index[config]
        except KeyError:
            raise ValueError(f"{config} is not in this search space") from None

    def reason_pruned(self, config: Config) -> str | None:
        """Why ``config`` was pruned, or None if it was not."""
        for c, why in self.pruned:
            if c == config:
                return why
        return None

    def values(self, knob: str) -> list:
        """Sorted distinct values one knob takes over ``configs``."""
        return sorted({getattr(c, knob) for c in self.configs}, key=lambda v: (str(type(v)), v))

    def sizes(self) -> dict:
        """Counts, for reports: configs, pruned, and pruned by kind of reason."""
        by_kind: dict[str, int] = {}
        for _, why in self.pruned:
            k = _reason_kind(why)
            by_kind[k] = by_kind.get(k, 0) + 1
        return {"configs": len(self.configs), "pruned": len(self.pruned), "pruned_by_reason": by_kind,
                "totals": list(self.totals), "cores": self.cores, "devices": list(self.devices),
                "env_cpu_fraction": round(self.env_cpu_fraction, 4)}

    def summary(self) -> str:
        """One line, e.g. ``"113 configs for 16 envs on 2 cores (cpu); 62 pruned: ..."``."""
        s = self.sizes()
        totals = "/".join(str(t) for t in self.totals)
        line = f"{s['configs']} configs for {totals} envs on {self.cores} cores ({', '.join(self.devices)})"
        if s["pruned"]:
            kinds = "; ".join(f"{n} {k}" for k, n in sorted(s["pruned_by_reason"].items(), key=lambda kv: -kv[1]))
            line += f"; {s['pruned']} pruned ({kinds})"
        return line

    def neighbours(self, config: Config) -> list[Config]:
        """Configs one step away from ``config``: the next smaller or larger value of one knob
        (degree, replicas, batch) with the rest unchanged, the other device, or the next
        actor count with the other knobs kept at the same share of an actor's envs."""
        out: list[Config] = []
        same_actor = [c for c in self.configs if c.num_actors == config.num_actors and c.num_envs == config.num_envs]
        for knob in SHARE_KNOBS:
            others = [k for k in (*SHARE_KNOBS, "policy_device") if k != knob]
            key = operator.attrgetter(knob)
            line = sorted((c for c in same_actor if all(getattr(c, k) == getattr(config, k) for k in others)),
                          key=key)
            out += _adjacent(line, config, key)
        out += [c for c in same_actor if c.policy_device != config.policy_device
                and (c.env_parallel_degree, c.policies_per_actor, c.policy_batch_size)
                == (config.env_parallel_degree, config.policies_per_actor, config.policy_batch_size)]
        actor_counts = sorted({c.num_actors for c in self.configs if c.num_envs == config.num_envs})
        if config.num_actors in actor_counts:
            k = actor_counts.index(config.num_actors)
            for a in actor_counts[max(0, k - 1):k] + actor_counts[k + 1:k + 2]:
                cands = [c for c in self.configs if c.num_actors == a and c.num_envs == config.num_envs]
                if cands:
                    best = min(_shape_distance(c, config) for c in cands)
                    out += [c for c in cands if _shape_distance(c, config) == best]
        seen: set[Config] = set()
        return [c for c in out if c != config and not (c in seen or seen.add(c))]  # type: ignore[func-returns-value]


def _adjacent(line: list[Config], config: Config, key) -> list[Config]:
    if config in line:
        k = line.index(config)
        return line[max(0, k - 1):k] + line[k + 1:k + 2]
    # ``config`` is not in the space (a user's start config): take the closest values.
    lo = [c for c in line if key(c) < key(config)]
    hi = [c for c in line if key(c) > key(config)]
    return lo[-1:] + hi[:1]


def _shape_distance(a: Config, b: Config) -> float:
    """How differently two configs split an actor, as shares of its envs (log2 units)."""
    d = 0.0
    for knob in SHARE_KNOBS:
        d += abs(math.log2(getattr(a, knob) / a.envs_per_actor) - math.log2(getattr(b, knob) / b.envs_per_actor))
    return d + (4.0 if a.policy_device != b.policy_device else 0.0)


def weighted_processes(config: Config, env_cpu_fraction: float = 1.0) -> float:
    """``config.num_processes`` with the env-stepping ones (actor processes and env workers)
    counted by the share of their time the env computes rather than waits, at least
    ``MIN_ENV_CPU_SHARE``.

    >>> c = Config(num_actors=1, envs_per_actor=16, env_parallel_degree=16)
    >>> c.num_processes, weighted_processes(c), weighted_processes(c, env_cpu_fraction=0.05)
    (15, 15.0, 3.75)
    """
    share = min(1.0, max(MIN_ENV_CPU_SHARE, float(env_cpu_fraction)))
    actors = config.num_actors if config.num_actors > 1 else 0  # one actor runs in the caller
    env_procs = actors + config.num_actors * (config.env_parallel_degree - 1)
    return config.num_processes - env_procs * (1.0 - share)


def config_problem(config: Config, cores: int, cuda_count: int | None = None,
                   env_cpu_fraction: float = 1.0) -> str | None:
    """Why ``config`` is not worth running on ``cores`` cores, or None. ``env_cpu_fraction``:
    the share of an env step spent computing (the profile's); below 1, env-stepping processes
    count by it (:func:`weighted_processes`)."""
    dev = _device_problem(config.policy_device, _cuda_device_count() if cuda_count is None else cuda_count)
    if dev:
        return dev
    procs = config.num_processes
    weighted = weighted_processes(config, env_cpu_fraction)
    if weighted > MAX_PROCESSES_PER_CORE * cores:
        counted = f"; {weighted:g} counting env processes by their CPU share" if weighted < procs else ""
        return f"more processes ({procs}{counted}) than {MAX_PROCESSES_PER_CORE}x cores ({cores})"
    if config.policies_per_actor * config.policy_batch_size > config.envs_per_actor:
        return (f"policies_per_actor*policy_batch_size ({config.policies_per_actor * config.policy_batch_size}) > "
                f"envs_per_actor ({config.envs_per_actor}): a replica could never get a full batch")
    if config.policy_device != "cpu" and config.num_actors * config.policies_per_actor > MAX_CUDA_REPLICAS:
        return (f"more CUDA replicas ({config.num_actors * config.policies_per_actor}) than {MAX_CUDA_REPLICAS} "
                f"(each holds its own CUDA context)")
    return None


def serial_baseline(start: Config) -> Config:
    """The serial config a tuner measures beside ``start`` (online and offline): every env in
    one process, the policy where the start's runs (a GPU user's own loop acts on the GPU;
    serial with CPU inference took most of a 45 s budget on the H200 box, 2026-11-27).

    >>> serial_baseline(Config(num_actors=2, envs_per_actor=4, policy_device="cuda")) == Config.serial(8, "cuda")
    True
    """
    return Config.serial(start.num_envs, start.policy_device)


def build_space(num_envs: int, *, cores: int | None = None, devices: Sequence[str] | None = None,
                num_envs_options: Iterable[int] | None = None,
                cluster: ClusterResources | None = None, env_cpu_fraction: float = 1.0) -> SearchSpace:
    """Every valid config for ``num_envs`` envs on this machine.

    Args:
        num_envs: the user's total envs; the space keeps it fixed.
        cores: usable cores (default: this process's affinity).
        devices: policy devices to consider (default ``["cpu"]`` plus ``"cuda"`` when
            available). A CUDA device that does not exist is pruned with its reason.
        num_envs_options: opt in to other totals (e.g. ``range(8, 33, 8)``): this changes
            the learning algorithm, so it is never the default. ``num_envs`` is always kept.
        cluster: for the ``ray`` backend, the cluster's nodes (:func:`ray_cluster_resources`):
            the core budget is then the cluster's total CPUs (unless ``cores`` is given), the
            GPUs are the cluster's, and a config whose actors do not fit the nodes (an actor
            runs all its processes on one node, one CPU each) is pruned with the reason.
        env_cpu_fraction: the share of an env step the env computes (the rest it waits, like
            a remote simulator); below 1 the process cap counts env-stepping processes by
            it, so an env that waits can get a process per env on a small machine. The
            tuner passes its profile's value (:class:`~auturi.tuner.profile.Profile`).

    Raises:
        ValueError: a total is not a positive integer.

    >>> import auturi
    >>> print(auturi.build_space(4, cores=2, devices=["cpu"]).summary())
    25 configs for 4 envs on 2 cores (cpu); 11 pruned (11 policies_per_actor*policy_batch_size > envs_per_actor)
    >>> wide = auturi.build_space(8, cores=2, devices=["cpu"], num_envs_options=[4, 16])
    >>> wide.totals, wide.reason_pruned(auturi.Config(num_actors=4, envs_per_actor=4, env_parallel_degree=4))
    ((4, 8, 16), 'more processes (16) than 4x cores (2)')
    """
    totals = sorted({int(num_envs), *(int(n) for n in (num_envs_options or ()))})
    if totals[0] < 1:
        raise ValueError(f"totals of envs must be >= 1, got {totals}")
    if cluster is None:
        cores = int(cores or usable_cores())
        devs = tuple(devices) if devices is not None else tuple(available_devices())
        cuda_count = _cuda_device_count() if any(d != "cpu" for d in devs) else 0
    else:
        cores = int(cores or cluster.total_cpus)
        cuda_count = cluster.total_gpus
        devs = tuple(devices) if devices is not None else ("cpu",) + (("cuda",) if cuda_count else ())
    configs: list[Config] = []
    pruned: list[Pruned] = []
    for n in totals:
        for a in divisors(n):
            e = n // a
            ds = divisors(e)
            for d in ds:
                for p in ds:
                    for b in ds:
                        for dev in devs:
                            c = Config(num_actors=a, envs_per_actor=e, env_parallel_degree=d,
                                       policies_per_actor=p, policy_device=dev, policy_batch_size=b)
                            why = (cluster.problem(c) if cluster is not None else None) or \
                                config_problem(c, cores, cuda_count, env_cpu_fraction)
                            (pruned.append((c, why)) if why else configs.append(c))
    return SearchSpace(totals=tuple(totals), cores=cores, devices=devs, configs=configs, pruned=pruned,
                       env_cpu_fraction=min(1.0, float(env_cpu_fraction)))
