"""Component profiling and the analytic throughput model the ``model`` strategy ranks with.

:func:`profile_executor` times the parts once, in this process, without starting workers:
one env's step time (mean, spread, and how much of it is CPU rather than waiting), the
observation size, and the policy's latency against batch size on each device. Three costs
cannot be timed in-process: the round trip to a worker process (``ipc_seconds``), the
executor's bookkeeping per env step (``env_overhead_seconds``) and what time-slicing more
busy processes than cores costs (``contention``). They start at defaults and
:func:`fit_overheads` fits them to the configs measured so far (the start and serial configs
are always measured first, so the fit has data from the beginning).

:func:`predict` is a per-actor pipeline model, limited by the cores:

- an actor's envs are split over ``D`` env lanes, each stepping ``E/D`` envs per row (the
  actor's own process is one of them, ``D - 1`` are env workers); its ``ceil(E/B)`` forward
  passes per row are shared by ``P`` replicas (the actor itself when ``P = 1``); a remote
  lane adds a round trip per task, inflated when there are more busy processes than cores;
- with one batch per row (``B = E``) env stepping and inference alternate, so their times
  add; with ``g`` batches they overlap: ``max(env, policy) + min(env, policy) / g``; with
  everything in one process (the serial point) they always add;
- lock-step env lanes wait for the slowest: ``std * sqrt(E/D) * sqrt(2 ln D)`` per row;
- actors run in parallel (``shm``) or one after another (``serial`` backend);
- the total is capped by ``cores / (CPU seconds per env step)``, and divided by
  ``1 + contention * (busy processes - cores) / cores`` when processes outnumber cores.

Example:
    >>> from auturi import Config
    >>> from auturi.tuner.profile import Profile, predict
    >>> p = Profile(env_step_seconds=1e-3, env_cpu_fraction=0.0, policy_seconds={"cpu": {1: 1e-4, 16: 2e-4}},
    ...             cores=2)
    >>> predict(Config(envs_per_actor=16, env_parallel_degree=16), p) > predict(Config.serial(16), p)
    True
"""
from __future__ import annotations

import functools
import itertools
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from auturi.config import Config
from auturi.executor.layout import plan_layout
from auturi.resources import usable_cores

DEFAULT_IPC_SECONDS = 60e-6
"""Round trip to a worker process before any measurement: a semaphore wake-up on a busy
machine costs tens of microseconds, not the ~5 us of an idle one."""
DEFAULT_ENV_OVERHEAD_SECONDS = 3e-6
"""The executor's bookkeeping per env step (buffer writes, auto-reset checks)."""

DEFAULT_CONTENTION = 0.1
"""Throughput lost per extra busy process per core: small, until measured otherwise."""

# The grids :func:`fit_overheads` searches (log-spaced: the costs span orders of magnitude).
_GRIDS = {
    "ipc_seconds": [float(x) for x in np.geomspace(5e-6, 5e-3, 25)],
    "env_overhead_seconds": [0.0] + [float(x) for x in np.geomspace(5e-7, 2e-4, 14)],
    "contention": [0.0, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0],
}
_PRIOR_WEIGHT = 0.02  # pulls an unidentified cost (no config exercised it yet) to the profile's value


@dataclass
class Profile:
    """What the model knows about a workload on this machine. Times are seconds."""

    env_step_seconds: float
    """Mean wall time of one env step (auto-reset included)."""
    env_step_std: float = 0.0
    """Standard deviation of one step's time (heavy tails show here)."""
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
    """Usable cores."""
    backend: str = "shm"
    """``shm``: actors and lanes run in parallel processes; ``serial``: all in one process."""
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
        pts = sorted((int(b), float(s)) for b, s in table[dev].items())
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
        return cls(**d)

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


def _interp(pts: list[tuple[int, float]], x: int) -> float:
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


# ---------------------------------------------------------------------------- the model
@functools.lru_cache(maxsize=4096)
def busy_processes(config: Config) -> int:
    """Processes that step envs or run a policy during a collect, as the layout plan counts
    them (:attr:`~auturi.executor.layout.LayoutPlan.busy_processes`); cached, because the
    model's fit predicts every config many times."""
    return plan_layout(config, cores=(0,)).busy_processes  # the count does not depend on the cores


def predict(config: Config, prof: Profile) -> float:
    """Predicted env steps per second of ``config`` (see the module docstring)."""
    A, E, D, P, B = (config.num_actors, config.envs_per_actor, config.env_parallel_degree,
                     config.policies_per_actor, config.policy_batch_size)
    dev = config.policy_device
    te = prof.env_step_seconds + prof.env_overhead_seconds
    g = math.ceil(E / B)  # forward passes per row
    L = prof.policy_latency(dev, B)
    if prof.backend == "serial":
        # Lanes and actors all run in this process, one after another.
        row = E * te + g * L + ((D > 1) * D + (P > 1) * g) * prof.env_overhead_seconds
        return A * E / (A * row) if row > 0 else math.inf

    # The actor's own process steps one env share; degree - 1 env workers step the rest.
    busy = busy_processes(config)
    # Wake-ups slow down once processes outnumber cores: a woken worker waits for a core.
    ipc = prof.ipc_seconds * (1.0 + max(0, busy - prof.cores) / prof.cores)
    m = E // D  # envs per env lane
    # Tasks each env lane gets per row: a lane's envs step together, so they come back ready
    # together and ride in the same batch unless the batch is smaller than the lane.
    env_tasks = math.ceil(m / B)
    if D > 1:
        straggle = prof.env_step_std * math.sqrt(m) * math.sqrt(2 * math.log(D))
        s_env = m * te + env_tasks * ipc + straggle
    else:
        s_env = E * te
    s_pol = (g / P) * (L + ipc) if P > 1 else g * L
    if D == 1 and P == 1:
        row = s_env + s_pol  # one process does both, in turn
    else:
        row = max(s_env, s_pol) + min(s_env, s_pol) / g
        # The actor itself steps its own env share and, with one replica, runs inference.
        row = max(row, (m * te if D > 1 else E * te) + (g * L if P == 1 else 0.0))
    pipeline = A * E / row if row > 0 else math.inf

    # CPU cap: seconds of CPU each env step costs, wherever it runs.
    ipc_cpu = 0.5 * prof.ipc_seconds  # the busy part of a round trip, both sides
    tasks_per_row = (D - 1) * env_tasks + (g if P > 1 else 0)
    cpu_per_step = (prof.env_step_seconds * prof.env_cpu_fraction + prof.env_overhead_seconds
                    + g * prof.policy_latency(dev, B, cpu=True) / E + tasks_per_row * ipc_cpu / E)
    cap = prof.cores / cpu_per_step if cpu_per_step > 0 else math.inf
    # Time-slicing more busy processes than cores costs context switches and cold caches.
    return min(pipeline, cap) / (1.0 + prof.contention * max(0, busy - prof.cores) / prof.cores)


def fit_overheads(prof: Profile, measured: Iterable[tuple[Config, float]], sweeps: int = 3) -> Profile:
    """``prof`` with the costs profiling cannot time (``ipc_seconds``,
    ``env_overhead_seconds``, ``contention``) fitted to measured throughputs: least squares
    on log throughput, with a weak pull to ``prof``'s own values (the defaults, unless set)
    so a cost no measured config exercised stays where it was. Coordinate descent over a
    log grid per cost."""
    pts = [(c, float(v)) for c, v in measured if v and math.isfinite(v) and v > 0]
    if not pts:
        return prof

    prior = {k: getattr(prof, k) for k in _GRIDS}

    def loss(p: Profile) -> float:
        err = 0.0
        for c, v in pts:
            y = predict(c, p)
            err += (math.log(y) - math.log(v)) ** 2 if y > 0 and math.isfinite(y) else 1e6
        for k, d in prior.items():
            err += _PRIOR_WEIGHT * math.log((getattr(p, k) + 1e-6) / (d + 1e-6)) ** 2
        return err

    best = prof
    best_err = loss(best)
    for _ in range(sweeps):
        improved = False
        for k, grid in _GRIDS.items():
            for x in grid:
                cand = replace(best, **{k: x})
                e = loss(cand)
                if e < best_err - 1e-12:
                    best, best_err, improved = cand, e, True
        if not improved:
            break
    return best


# ---------------------------------------------------------------------------- profiling
def profile_executor(executor: Any, batch_sizes: Sequence[int] | None = None,
                     devices: Sequence[str] | None = None, *, env_seconds: float = 0.3,
                     policy_seconds: float = 0.05, cores: int | None = None) -> Profile:
    """Time the executor's env and policy in this process (no workers are started).

    Args:
        executor: an :class:`auturi.Executor` (uses ``env_fns[0]``, ``policy``, ``seed``).
        batch_sizes: batch sizes to time (default powers of two up to ``num_envs``, and it).
        devices: devices to time the policy on (default ``["cpu"]``).
        env_seconds: about how long to step the env (at least 20 steps).
        policy_seconds: about how long to time each batch size (at least 3 calls).
        cores: usable cores (default: this process's affinity).

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
    env_mean, env_std, cpu_frac, obs = time_env(env_fns[0], seed=int(getattr(executor, "seed", 0)),
                                                seconds=env_seconds)
    if batch_sizes is None:
        batch_sizes = sorted({2 ** k for k in range(int(math.log2(n)) + 1)} | {n})
    wall: dict[str, dict[int, float]] = {}
    cpu: dict[str, dict[int, float]] = {}
    for dev in devices or ["cpu"]:
        wall[dev], cpu[dev] = time_policy(policy, obs, sorted(set(batch_sizes)), dev, seconds=policy_seconds)
    return Profile(env_step_seconds=env_mean, env_step_std=env_std, env_cpu_fraction=cpu_frac,
                   obs_bytes=int(np.asarray(obs).nbytes), policy_seconds=wall, policy_cpu_seconds=cpu,
                   cores=int(cores or usable_cores()), backend=str(getattr(executor, "backend", "shm")),
                   profile_seconds=time.perf_counter() - t_start)


def time_env(env_fn: Any, seed: int = 0, seconds: float = 0.3, min_steps: int = 20,
             max_steps: int = 5000) -> tuple[float, float, float, np.ndarray]:
    """Step one env with seeded random actions; returns (mean step seconds, std, CPU
    fraction, one observation). A reset after an episode ends counts in that step."""
    env = env_fn()
    try:
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        times: list[float] = []
        w0, c0 = time.perf_counter(), time.process_time()
        while len(times) < max_steps and (len(times) < min_steps or time.perf_counter() - w0 < seconds):
            a = env.action_space.sample()
            t = time.perf_counter()
            _, _, term, trunc, _ = env.step(a)
            if term or trunc:
                env.reset()
            times.append(time.perf_counter() - t)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    finally:
        env.close()
    frac = min(1.0, cpu / wall) if wall > 0 else 1.0
    return statistics.fmean(times), statistics.pstdev(times), frac, np.asarray(obs)


def time_policy(policy: Any, obs: np.ndarray, batch_sizes: Sequence[int], device: str = "cpu",
                seconds: float = 0.05, min_calls: int = 3,
                max_calls: int = 50) -> tuple[dict[int, float], dict[int, float]]:
    """Median wall and mean CPU seconds of ``policy.act`` per batch size, on a copy of the
    policy moved to ``device`` (the executor's own policy object is left where it is)."""
    import cloudpickle

    from auturi.executor.policy_runner import best_threads, torch_threads, uses_torch

    replica = cloudpickle.loads(cloudpickle.dumps(policy))
    state = policy.get_state()
    if state:
        replica.load_state(state)
    replica.to(device)
    k = int(getattr(policy, "noise_dim", 0))
    rng = np.random.default_rng(0)
    wall: dict[int, float] = {}
    cpu: dict[int, float] = {}
    for b in batch_sizes:
        batch = np.repeat(np.asarray(obs)[None], b, axis=0)
        noise = rng.random((b, k), dtype=np.float32)
        for _ in range(2):  # first calls build the model, allocate, pick kernels
            replica.act(batch, noise)
        # Timed at the torch thread count the executor's PolicyRunner would choose for it.
        threads = best_threads(lambda: replica.act(batch, noise)) if uses_torch(replica) else None
        ts: list[float] = []
        with torch_threads(threads):
            c0, w0 = time.process_time(), time.perf_counter()
            while len(ts) < max_calls and (len(ts) < min_calls or time.perf_counter() - w0 < seconds):
                t = time.perf_counter()
                replica.act(batch, noise)
                ts.append(time.perf_counter() - t)
        wall[b] = statistics.median(ts)
        cpu[b] = (time.process_time() - c0) / len(ts)
    return wall, cpu
