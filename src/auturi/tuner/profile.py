"""What the ``model`` strategy knows about a workload on this machine (:class:`Profile`), the
priors its untimed costs start from, and profiling an executor to fill one.

The tuner's profile is split by role over three modules (2026-11-26): this one holds the
:class:`Profile` (its fields and their priors, the policy's latency table, its JSON form)
and builds one for an executor (:func:`profile_executor`, :func:`collect_fields`);
:mod:`~auturi.tuner.model` is the analytic throughput model that reads it
(:func:`~auturi.tuner.model.predict`) and the fit of its untimed costs
(:func:`~auturi.tuner.model.fit_overheads`); :mod:`~auturi.tuner.timing` times one env and
one policy in this process. Profiling from training rollouts lives in
:mod:`~auturi.tuner.rollout_profile`. The names that moved to :mod:`~auturi.tuner.model` and
:mod:`~auturi.tuner.timing` are re-exported here, so ``from auturi.tuner.profile import
predict, time_env`` keeps working; those two modules do not import this one back (the import
checker, ``tests/test_imports.py``, counts every import, and that would close a circle), which
is also why :func:`profile_executor`, which returns a :class:`Profile`, is here and not in
:mod:`~auturi.tuner.timing`.

:func:`profile_executor` times the parts once, in this process, without starting workers:
one env's step time (mean, spread, and how much of it is CPU rather than waiting), the
observation size, and the policy's latency against batch size on each device. Some costs
cannot be timed in-process: the round trip to a worker process (``ipc_seconds``), the
executor's bookkeeping per env step (``env_overhead_seconds``) and per task the actor hands
out in the overlapped loop (``post_seconds``), what time-slicing more busy processes than
cores costs (``contention``), a loaded core's slower env step (``loaded_step_factor``), the
device's queue (``device_share``), and the per-collect and cross-node costs (the model's
:func:`~auturi.tuner.model.collect_overhead` and :func:`~auturi.tuner.model.cross_node_seconds`).
They start at the defaults below and :func:`~auturi.tuner.model.fit_overheads` fits them to
the configs measured so far (the start and serial configs are always measured first, so the
fit has data from the beginning).

Example:
    >>> p = Profile(env_step_seconds=1e-3, policy_seconds={"cpu": {1: 1e-4, 16: 2e-4}})
    >>> round(p.policy_latency("cpu", 8) * 1e6)  # interpolated between the profiled batch sizes
    147
    >>> Profile.from_dict(p.to_dict()) == p
    True
"""
from __future__ import annotations

import functools
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from auturi.resources import ray_node_cores, usable_cores

# Re-exported: the names that moved to model.py and timing.py (2026-11-26), public ones and the
# private ones tests use, so imports from this module keep working. Inside auturi, import them
# from where they are defined.
from auturi.tuner.model import (  # noqa: F401
    STEP_EXTRA_BYTES,
    _cpu_busy,
    _overlapped_row,
    actors_per_node,
    busy_processes,
    collect_overhead,
    cross_node_seconds,
    expected_max_z,
    fit_overheads,
    overlaps,
    predict,
    straggle,
)
from auturi.tuner.timing import (  # noqa: F401
    MIN_TAIL_STEPS,
    STEP_QUANTILES,
    EnvTiming,
    step_quantiles,
    time_env,
    time_policy,
)

DEFAULT_IPC_SECONDS = 60e-6
"""Round trip to a worker process before any measurement: a semaphore wake-up on a busy
machine costs tens of microseconds, not the ~5 us of an idle one."""
DEFAULT_ENV_OVERHEAD_SECONDS = 3e-6
"""The executor's bookkeeping per env step (buffer writes, auto-reset checks)."""

DEFAULT_CONTENTION = 0.1
"""Throughput lost per extra busy process per core: small, until measured otherwise."""

DEFAULT_DEVICE_SHARE = 0.0
"""No queueing for the device until fitted: profiling times one process's passes alone, and a
pass's latency is mostly launching and synchronising, which processes do side by side (the
emulated device of :mod:`auturi.testing.emulated_gpu` runs each process's passes as if it
had the device alone). On the GPU box of 2026-11-26, 8 actors each with a CUDA policy
measured 9,073 steps/s where the model without this queue predicts 14-15k."""

DEFAULT_LOADED_STEP_FACTOR = 1.0
"""An env step's CPU time with every core busy, over its time alone, until fitted. The GPU
box of 2026-11-26 (16 vCPUs, Pong; ``../shared/data/gpu-2026-11-26/``) fits 1.8 to all its
measured configs, 2.7 to those other than degree 16 (``python -m bench.model_check``): its
CUDA layouts with 16-32 busy processes measured 9-14k steps/s where 16 cores at the profiled
0.45 ms a step allow 33k, and 1 x 64 at degree 16 and 32 (16 and 32 processes) measured the
same 12.4-13k, i.e. the cores were saturated at about 1 ms of CPU a step (16 vCPUs that are
8 cores' SMT siblings would do that)."""

DEFAULT_POST_SECONDS = 70e-6
"""The actor's own time per task it hands out in the overlapped loop (a batch's steps posted
to an env worker, a batch handed to a replica, and handling their reports): the emulated GPU
box on the 2 shared cores (2026-11-26, load 4-6; ``python -m bench.model_check``), the actors'
busy time less their env steps and forward passes, over their tasks: 56-86 us on 9 of 10
layouts (135 us on the tenth), median ~65 us. Kept apart from ``ipc_seconds``, a round
trip's latency, which fits lockstep layouts' waits for a core (0.07-1.1 ms on the GPU box's
record) rather than any CPU the actor spends."""

# Per-collect fixed costs, by what a layout wakes: a 1-step collect's median time less the
# model's row for it (profiled, spread 0), 4 CartPole envs and a random policy on this
# 2-core machine under a load of ~2.6, 3 rounds of 400 collects (/tmp script, issue 16):
# serial 18-26 us; 2 actors 180-238 us; degree 2 74-150 us; 2 replicas 103-130 us.
DEFAULT_COLLECT_SECONDS = 25e-6
"""Any collect: the rollout block, the noise, copying the rollout out."""
DEFAULT_ACTOR_COLLECT_SECONDS = 100e-6
"""Per actor process: waking it and waiting for it (control block, semaphores)."""
DEFAULT_RAY_ACTOR_COLLECT_SECONDS = 1.8e-3
"""Per Ray actor: a remote call and ``ray.get`` of its block. A local Ray instance here
(2 CPUs, loaded), 1-step collects of 4 CartPole envs, median of 200: 1 actor 1.82 ms,
2 actors 4.15 ms, less the model's row (63 and 33 us)."""
DEFAULT_ENV_WORKER_COLLECT_SECONDS = 100e-6
"""Waking env workers at a collect's start (their per-row hand-offs are priced per step)."""
DEFAULT_REPLICA_COLLECT_SECONDS = 100e-6
"""Waking replica processes and checking their weights version."""

# Across nodes (ray): a remote actor's rollout comes back, and new weights go out, over the
# network. Prior: a Ray object transfer's latency and a 10 Gb/s link's practical rate.
DEFAULT_CROSS_NODE_SECONDS = 2e-3
"""Latency of one collect's round trip to actors on other nodes than the caller's (fitted)."""
DEFAULT_NETWORK_BYTES_PER_SECOND = 1e9
"""Rate of rollouts and weights between nodes (fitted)."""


@dataclass
class Profile:
    """What the model knows about a workload on this machine. Times are seconds."""

    env_step_seconds: float
    """Mean wall time of one env step (auto-reset included)."""
    env_step_std: float = 0.0
    """Standard deviation of one step's time (heavy tails show here)."""
    env_step_quantiles: tuple[float, ...] = ()
    """One step's time at ``STEP_QUANTILES`` evenly spaced probability levels, where profiling
    stepped enough (``MIN_TAIL_STEPS``): what the slowest of several lanes takes is read from
    them (:func:`straggle`); empty: from ``env_step_std`` as a normal spread."""
    env_cpu_fraction: float = 1.0
    """CPU time / wall time while stepping: ~1 for a simulator, ~0 for one that waits."""
    obs_bytes: int = 0
    """Bytes of one observation."""
    policy_seconds: dict[str, dict[int, float]] = field(default_factory=dict)
    """Wall time of one forward pass, by device then batch size."""
    policy_cpu_seconds: dict[str, dict[int, float]] = field(default_factory=dict)
    """CPU time of one forward pass (all threads), by device then batch size; defaults to
    ``policy_seconds`` on the CPU and a tenth of it on a GPU (launch overhead)."""
    ipc_seconds: float = DEFAULT_IPC_SECONDS
    """Round trip to a worker process on an idle machine (fitted)."""
    env_overhead_seconds: float = DEFAULT_ENV_OVERHEAD_SECONDS
    """Bookkeeping per env step (fitted)."""
    contention: float = DEFAULT_CONTENTION
    """Throughput lost to time-slicing, per busy process beyond the cores, per core (fitted)."""
    cores: int = 1
    """Usable cores (on the ``ray`` backend: the cluster's; ``node_cores`` splits them)."""
    backend: str = "shm"
    """``shm``: actors and lanes run in parallel processes; ``serial``: all in one process;
    ``ray``: every actor is a Ray actor (a remote call per collect, even on the caller's node)."""
    num_steps: int = 0
    """Steps per env of one collect (the training's rollout length, e.g. an off-policy
    ``train_freq`` of 1); 0: unknown, and the per-collect costs below are left out."""
    collect_seconds: float = DEFAULT_COLLECT_SECONDS
    """Fixed cost of any collect (fitted)."""
    actor_collect_seconds: float = DEFAULT_ACTOR_COLLECT_SECONDS
    """Added per collect for each actor that is a process of its own (fitted)."""
    env_worker_collect_seconds: float = DEFAULT_ENV_WORKER_COLLECT_SECONDS
    """Added per collect when actors have env workers (fitted)."""
    replica_collect_seconds: float = DEFAULT_REPLICA_COLLECT_SECONDS
    """Added per collect when actors have replica processes (fitted)."""
    node_cores: tuple[int, ...] = ()
    """``ray`` across nodes: each node's cores, the caller's node first; () for one machine."""
    cross_node_seconds: float = DEFAULT_CROSS_NODE_SECONDS
    """Per-collect latency when actors run on other nodes than the caller's (fitted)."""
    network_bytes_per_second: float = DEFAULT_NETWORK_BYTES_PER_SECOND
    """Rate of rollouts back from, and weights out to, other nodes (fitted)."""
    weights_bytes: int = 0
    """Bytes of the policy's state, sent to each actor on another node per update."""
    loaded_step_factor: float = DEFAULT_LOADED_STEP_FACTOR
    """How many times its CPU time one env step takes when every core is busy, against one
    env stepping alone (SMT siblings, shared caches, memory bandwidth); 1.0: the cores scale
    perfectly. Measured where ``env_loaded_step_seconds`` is (the fit then starts there),
    else fitted (see :data:`DEFAULT_LOADED_STEP_FACTOR`)."""
    env_loaded_step_seconds: float = 0.0
    """One env step's wall seconds with a copy of the env stepping on every core at once
    (:func:`auturi.executor.loaded.time_env_loaded`; ``auturi tune`` on 4 cores or more); 0: not
    measured."""
    device_share: float = DEFAULT_DEVICE_SHARE
    """Share of a forward pass's latency on a device (not the CPU) during which it holds the
    one device, so other processes' passes queue behind it (fitted; see
    :data:`DEFAULT_DEVICE_SHARE`)."""
    post_seconds: float = DEFAULT_POST_SECONDS
    """The actor's own time per task it hands out in the executor's overlapped loop (fitted
    once an overlapped layout is measured; see :data:`DEFAULT_POST_SECONDS`)."""
    profile_seconds: float = 0.0
    """What profiling cost."""

    def policy_latency(self, device: str, batch: int, cpu: bool = False) -> float:
        """Seconds of one forward pass of ``batch`` observations on ``device``, linearly
        interpolated between profiled batch sizes (and extrapolated past them)."""
        table = self.policy_cpu_seconds if cpu else self.policy_seconds
        dev = _device_key(table, device) if table else None
        if dev is None:
            if cpu and self.policy_seconds:
                wall = self.policy_latency(device, batch)
                return wall if device == "cpu" else 0.1 * wall
            if not self.policy_seconds:
                return 0.0
            dev = _device_key(self.policy_seconds, device) or "cpu"
            table = self.policy_seconds
            if dev not in table:
                dev = next(iter(table))
        pts = _points(tuple(table[dev].items()))
        if not pts:
            return 0.0
        return _interp(pts, batch)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("policy_seconds", "policy_cpu_seconds"):
            d[k] = {dev: {str(b): s for b, s in t.items()} for dev, t in d[k].items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        d = dict(d)
        for k in ("policy_seconds", "policy_cpu_seconds"):
            d[k] = {dev: {int(b): float(s) for b, s in t.items()} for dev, t in d.get(k, {}).items()}
        d["node_cores"] = tuple(int(c) for c in d.get("node_cores", ()))
        d["env_step_quantiles"] = tuple(float(q) for q in d.get("env_step_quantiles", ()))
        # A record written by a later version may hold fields this one does not know: they
        # are what that version fitted beyond this model, so they are left out, not an error.
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def replace(self, **changes: Any) -> Profile:
        return replace(self, **changes)


def _device_key(table: dict, device: str) -> str | None:
    if device in table:
        return device
    base = device.split(":")[0]
    if base in table:
        return base
    for k in table:
        if k.split(":")[0] == base:
            return k
    return None


@functools.lru_cache(maxsize=256)
def _points(items: tuple) -> tuple[tuple[int, float], ...]:
    """A latency table's (batch, seconds) points in batch order; cached by the table's
    contents, because the model's fit asks for the same few tables tens of thousands of
    times (sorting them anew was a quarter of a refit's time). A tuple: every caller shares it."""
    return tuple(sorted((int(b), float(s)) for b, s in items))


def _interp(pts: Sequence[tuple[int, float]], x: int) -> float:
    if len(pts) == 1:
        b, s = pts[0]
        return s * max(1.0, x / b) if x > b else s
    if x <= pts[0][0]:
        return pts[0][1]
    for (b0, s0), (b1, s1) in itertools.pairwise(pts):
        if x <= b1:
            return s0 + (s1 - s0) * (x - b0) / (b1 - b0)
    (b0, s0), (b1, s1) = pts[-2], pts[-1]
    return max(s1, s1 + (s1 - s0) * (x - b1) / (b1 - b0))


# ---------------------------------------------------------------------------- profiling
def profile_executor(executor: Any, batch_sizes: Sequence[int] | None = None,
                     devices: Sequence[str] | None = None, *, env_seconds: float = 0.3,
                     policy_seconds: float = 0.05, cores: int | None = None, num_steps: int | None = None,
                     node_cores: Sequence[int] | None = None, loaded: bool = False) -> Profile:
    """Time the executor's env and policy in this process (no workers are started).

    Args:
        executor: an :class:`auturi.Executor` (uses ``env_fns[0]``, ``policy``, ``seed``).
        batch_sizes: batch sizes to time (default powers of two up to ``num_envs``, and it).
        devices: devices to time the policy on (default ``["cpu"]``).
        env_seconds: about how long to step the env (at least 20 steps).
        policy_seconds: about how long to time each batch size (at least 3 calls).
        cores: usable cores (default: this process's affinity).
        num_steps, node_cores: see :func:`collect_fields`.
        loaded: also step a copy of the env on every core at once (:func:`should_time_loaded`
            says where: one machine of 4 cores or more, an env that computes), which sets
            ``env_loaded_step_seconds`` and ``loaded_step_factor``: about ``1 + warm-up``
            seconds and one process start per core.

    Raises:
        TypeError: ``executor`` lacks ``env_fns`` / ``policy`` (pass ``Profile`` yourself).
    """
    env_fns = getattr(executor, "env_fns", None)
    policy = getattr(executor, "policy", None)
    if not env_fns or policy is None:
        raise TypeError(f"cannot profile {type(executor).__name__}: it has no env_fns/policy. Pass a "
                        f"Profile to the model strategy: ModelStrategy(profile=Profile(...))")
    t_start = time.perf_counter()
    n = int(getattr(executor, "num_envs", len(env_fns)))
    env_mean, env_std, cpu_frac, obs, tail = time_env(env_fns[0], seed=int(getattr(executor, "seed", 0)),
                                                      seconds=env_seconds)
    if batch_sizes is None:
        batch_sizes = sorted({2 ** k for k in range(int(math.log2(n)) + 1)} | {n})
    wall: dict[str, dict[int, float]] = {}
    cpu: dict[str, dict[int, float]] = {}
    for dev in devices or ["cpu"]:
        wall[dev], cpu[dev] = time_policy(policy, obs, sorted(set(batch_sizes)), dev, seconds=policy_seconds)
    cores = int(cores or usable_cores())
    extra: dict[str, float] = {}
    if loaded and should_time_loaded(executor, cores, cpu_frac):
        from auturi.executor.loaded import loaded_step_factor, time_env_loaded

        timing = time_env_loaded(env_fns[0], cores, seed=int(getattr(executor, "seed", 0)))
        if timing is not None:
            extra = {"env_loaded_step_seconds": timing.step_seconds,
                     "loaded_step_factor": loaded_step_factor(env_mean, cpu_frac, timing.step_seconds)}
    return Profile(env_step_seconds=env_mean, env_step_std=env_std, env_step_quantiles=tail, env_cpu_fraction=cpu_frac,
                   obs_bytes=int(np.asarray(obs).nbytes), policy_seconds=wall, policy_cpu_seconds=cpu,
                   cores=cores, backend=str(getattr(executor, "backend", "shm")),
                   **collect_fields(executor, num_steps, node_cores), **extra,
                   profile_seconds=time.perf_counter() - t_start)


def should_time_loaded(executor: Any, cores: int, cpu_fraction: float) -> bool:
    """Whether :func:`profile_executor` times the env loaded: on one machine (not ``ray``,
    whose nodes the copies would not reach) of :data:`auturi.executor.loaded.MIN_CORES` cores
    or more, for an env that mostly computes (one that waits on a simulator elsewhere is not
    bounded by these cores) and steps itself (EnvPool's and ale-py's vector envs run their
    own threads)."""
    from auturi.executor.loaded import MIN_CORES

    fns = getattr(executor, "env_fns", None) or []
    return (cores >= MIN_CORES and cpu_fraction >= 0.5 and bool(fns)
            and str(getattr(executor, "backend", "shm")) != "ray" and not hasattr(fns[0], "make_runner"))


def collect_fields(executor: Any, num_steps: int | None = None,
                   node_cores: Sequence[int] | None = None) -> dict[str, Any]:
    """The :class:`Profile` fields about collects and nodes, for ``executor``.

    ``num_steps``: given, else the length of the executor's last collect (a tuner measures
    the start config before it profiles, at the training's length), else 0 (unknown). On the
    ``ray`` backend: a remote call's per-collect cost, the nodes' cores (given, else read
    from the connected cluster, the caller's node first) and, across nodes, the bytes of the
    policy's state that each update ships to every remote actor.
    """
    if num_steps is None:
        num_steps = max(0, int(getattr(executor, "last_num_steps", 0) or 0))  # Executor.last_num_steps
    out: dict[str, Any] = {"num_steps": int(num_steps)}
    if str(getattr(executor, "backend", "")) != "ray":
        return out
    out["actor_collect_seconds"] = DEFAULT_RAY_ACTOR_COLLECT_SECONDS
    out["node_cores"] = tuple(int(c) for c in (node_cores if node_cores is not None else ray_node_cores()))
    policy = getattr(executor, "policy", None)
    if len(out["node_cores"]) > 1 and policy is not None and hasattr(policy, "get_state"):
        import cloudpickle

        out["weights_bytes"] = len(cloudpickle.dumps(policy.get_state()))
    return out

