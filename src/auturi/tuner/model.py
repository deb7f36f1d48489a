"""The throughput model the ``model`` strategy ranks with: :func:`predict` reads a
:class:`~auturi.tuner.profile.Profile` and says how many env steps a second a config would
collect; :func:`fit_overheads` fits the profile's costs that profiling cannot time to the
configs measured so far.

Over 400 lines as one module: the row model (:func:`predict` down to :func:`_cpu_busy`) is
one computation cut into functions that read one another's terms (the busy processes, the
loaded env step, the device's queue, the overlapped loop's row), and the fit sits with it
because its loss is :func:`predict`'s error on measured configs and its grids and bounds say
where each of the model's costs means something; it hands back a profile with some fields
replaced, nothing more. What the profile holds, and profiling an executor to fill one, is in
:mod:`~auturi.tuner.profile`; timing one env and one policy in :mod:`~auturi.tuner.timing`.
This module does not import :mod:`~auturi.tuner.profile`: that module re-exports this one's
names (``from auturi.tuner.profile import predict`` keeps working), and the import checker
(``tests/test_imports.py``) counts every import, so importing it back would close a circle.
``Profile`` in the annotations here is :class:`auturi.tuner.profile.Profile`; the model reads
only its fields and :meth:`~auturi.tuner.profile.Profile.policy_latency`.

:func:`predict` is a per-actor pipeline model, limited by the cores:
- an actor's envs are split over ``D`` env lanes, each stepping ``E/D`` envs per row (the
  actor's own process is one of them, ``D - 1`` are env workers); its ``ceil(E/B)`` forward
  passes per row are shared by ``P`` replicas (the actor itself when ``P = 1``); a remote
  lane adds a round trip per task, inflated when there are more busy processes than cores;
- with one batch per row (``B = E``) env stepping and inference alternate, so their times
  add; with ``g`` batches they overlap: ``max(env, policy) + min(env, policy) / g``; with
  everything in one process (the serial point) they always add;
- lock-step env lanes wait for the slowest: the expected max of ``D`` lanes' row times,
  ``std * sqrt(E/D) * z(D)`` per row (:func:`expected_max_z`); with more lanes than cores,
  the ``ceil(D / cores)`` lanes pinned to a core take turns with their steps' CPU, and the
  cores stay idle while the row's batch is on the device;
- lock-step lanes waiting at the barrier hold no core for part of the wait
  (:data:`BARRIER_IDLE`), with the policy on a device;
- the executor's overlapped loop (the layout plan's ``ActorPlan.overlap``: batches of the
  first envs ready, spread over the lanes, env workers queueing several batches' steps) has
  no barrier; its row is simulated (:mod:`auturi.tuner.loop_sim`, :func:`_overlapped_row`):
  the loop's own dispatch rules over step times drawn from the profile, with the actor's
  host work per hand-off (``post_seconds``) and the round trips; the lockstep straggle and
  stall terms above do not apply;
- actors run in parallel (``shm``) or one after another (``serial`` backend);
- the total is capped by ``cores / (CPU seconds per env step)``, and divided by
  ``1 + contention * (busy processes - cores) / cores`` when processes outnumber cores, where
  a process counts by the share of the row it holds a core: an env-stepping one not while
  it waits inside its envs (a remote simulator's wait holds no core), nor, with the policy
  on a GPU, an env worker while its batch is on the device; a device replica only for its
  passes' CPU time; in the overlapped loop each process only for its CPU work (it blocks
  on its semaphore otherwise);
- with the cores loaded, an env step's CPU time grows by up to ``loaded_step_factor``
  (fitted once a config with the policy on a device is measured: profiling times one env
  alone, and a machine whose cores are SMT siblings or share memory bandwidth steps slower
  with every core busy; the GPU box of 2026-11-26 fits 1.8-2.7);
- processes whose forward passes share one device queue for it: ``device_share`` of each
  pass holds the device (fitted, 0 until then), priced by mean value analysis;
- across nodes (``ray``, ``node_cores``): actors are spread over the nodes as the executor's
  SPREAD placement places them (:func:`actors_per_node`), each node's cap and time-slicing
  count its own cores and processes, and a collect lasts as long as its slowest node;
- with the collect length known (``num_steps``; off-policy training often collects 1 step
  per env), a collect also pays fixed costs (:func:`collect_overhead`: the in-process part,
  plus one per kind of process it wakes: each actor, env workers, replicas) and, with actors on
  other nodes than the caller's, a round trip (:func:`cross_node_seconds`: a latency plus
  their rollouts back and the weights out over the network; no memory is shared with them).
  Throughput is then ``steps / (num_steps * row + fixed + round trip)``.

Example:
    >>> from auturi import Config
    >>> from auturi.tuner.profile import Profile
    >>> p = Profile(env_step_seconds=1e-3, env_cpu_fraction=0.0, policy_seconds={"cpu": {1: 1e-4, 16: 2e-4}},
    ...             cores=2)
    >>> predict(Config(envs_per_actor=16, env_parallel_degree=16), p) > predict(Config.serial(16), p)
    True
    >>> cheap = Profile(env_step_seconds=20e-6, policy_seconds={"cpu": {4: 60e-6, 8: 60e-6}}, cores=2)
    >>> two = Config(num_actors=2, envs_per_actor=4)  # two actor processes: waking them costs per collect
    >>> [predict(two, cheap.replace(num_steps=n)) > predict(Config.serial(8), cheap.replace(num_steps=n))
    ...  for n in (64, 1)]
    [True, False]
"""
from __future__ import annotations

import copy
import functools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from auturi.config import Config
from auturi.executor.actor_loop import OWN_THREAD_SECONDS
from auturi.executor.layout import plan_layout
from auturi.tuner.loop_sim import overlapped_row

STEP_EXTRA_BYTES = 32
"""Rollout bytes per env step besides the observation (action, reward, flags, extras)."""

# The grids :func:`fit_overheads` searches (log-spaced: the costs span orders of magnitude).
_GRIDS = {
    "ipc_seconds": [float(x) for x in np.geomspace(5e-6, 5e-3, 25)],
    "env_overhead_seconds": [0.0] + [float(x) for x in np.geomspace(5e-7, 2e-4, 14)],
    "contention": [0.0, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0],
    "loaded_step_factor": [1.0, 1.25, 1.5, 1.8, 2.2, 2.7, 3.3, 4.0],
    "device_share": [0.0, 0.1, 0.25, 0.5, 0.75, 1.0],
    "post_seconds": [float(x) for x in np.geomspace(5e-6, 5e-4, 13)],
}
# Where a cost means something: a loaded step is no faster than one alone; a pass holds the
# device at most a little longer than its latency (switching between processes' contexts).
_BOUNDS = {"loaded_step_factor": (1.0, 4.0), "device_share": (0.0, 1.5)}
# Costs whose prior is 0 (none until measured): pulled to it on a linear scale, not a log one.
_LINEAR_PRIORS = {"device_share"}
# Identified only when the profile knows the collect length (``num_steps``).
_COLLECT_GRIDS = {
    "collect_seconds": [float(x) for x in np.geomspace(1e-5, 2e-2, 12)],
    **{k: [0.0] + [float(x) for x in np.geomspace(1e-5, 5e-2, 13)]
       for k in ("actor_collect_seconds", "env_worker_collect_seconds", "replica_collect_seconds")},
}
# Identified only when the actors span nodes.
_NODE_GRIDS = {
    "cross_node_seconds": [float(x) for x in np.geomspace(1e-4, 0.2, 12)],
    "network_bytes_per_second": [float(x) for x in np.geomspace(1e7, 3e10, 12)],
}
_PRIOR_WEIGHT = 0.02  # pulls an unidentified cost (no config exercised it yet) to the profile's value
# ... weaker for the per-collect and cross-node costs: under load they measured 10-100x their
# idle priors, and a pull as strong as the per-step costs' kept the fit there (30% off).
_WEAK_PRIOR_WEIGHT = 0.002


@functools.lru_cache(maxsize=4096)
def busy_processes(config: Config) -> int:
    """Processes that step envs or run a policy during a collect, as the layout plan counts
    them (:attr:`~auturi.executor.layout.LayoutPlan.busy_processes`); cached, because the
    model's fit predicts every config many times."""
    return plan_layout(config, cores=(0,)).busy_processes  # the count does not depend on the cores


@functools.lru_cache(maxsize=4096)
def overlaps(config: Config) -> bool:
    """Whether the executor runs ``config``'s actors in the overlapped loop (the layout plan's
    ``ActorPlan.overlap``: env workers queue the steps of several batches, stepping one while
    another is in inference); False where the plan has no such loop."""
    actors = plan_layout(config, cores=(0,)).actors
    return bool(actors and getattr(actors[0], "overlap", False))


def expected_max_z(n: int) -> float:
    """Expected maximum of ``n`` independent standard normal draws (Blom's approximation:
    0.59 for the exact 0.56 at n = 2, within 1% from n = 8): what the slowest of ``n``
    lock-stepped lanes adds, in standard deviations of one lane's time; 0 for one lane. (The
    ``sqrt(2 ln n)`` it replaces is its limit for large n, 33% high at n = 16.)

    >>> [round(expected_max_z(n), 2) for n in (1, 2, 16, 32)]
    [0.0, 0.59, 1.77, 2.07]
    """
    if n <= 1:
        return 0.0
    return statistics.NormalDist().inv_cdf((n - 0.375) / (n + 0.25))



def straggle(prof: Profile, m: int, k: int) -> float:
    """Seconds the slowest of ``k`` lanes, each stepping ``m`` envs in turn, takes beyond the
    mean of ``m`` steps: from the profile's step-time quantiles where it has them (the
    expected maximum of ``k`` sums of ``m`` draws; :func:`_tail_straggle`), else a normal
    spread (``env_step_std * sqrt(m) * expected_max_z(k)``). A heavy tail (rare long steps,
    long resets) makes the slowest of many lanes slower than a normal spread says, and of a
    few lanes faster: on the emulated straggler profile, 32 lanes of one env measured a row
    ~1.5x the normal figure's.

    >>> from auturi.tuner.profile import Profile
    >>> p = Profile(env_step_seconds=1e-3, env_step_std=1e-4)
    >>> round(straggle(p, 4, 16) * 1e3, 3)
    0.354
    """
    if k <= 1 or m <= 0:
        return 0.0
    if prof.env_step_quantiles:
        return _tail_straggle(prof.env_step_quantiles, int(m), int(k))
    return prof.env_step_std * math.sqrt(m) * expected_max_z(k)


@functools.lru_cache(maxsize=1024)
def _tail_straggle(quantiles: tuple[float, ...], m: int, k: int, trials: int = 512) -> float:
    """E[max over ``k`` lanes of the sum of ``m`` steps] minus ``m`` times the mean step, by a
    seeded resampling of ``quantiles`` (the same figure every call)."""
    q = np.asarray(quantiles, dtype=np.float64)
    rng = np.random.default_rng(0)
    draws = q[rng.integers(0, len(q), size=(trials, k, m))].sum(axis=2)
    return max(0.0, float(draws.max(axis=1).mean() - m * q.mean()))


def actors_per_node(config: Config, node_cores: Sequence[int]) -> list[int]:
    """How many of ``config``'s actors each node runs, as the ``ray`` executor's SPREAD
    placement group spreads them: one at a time over the nodes in turn, the caller's node
    first, passing over a node without a CPU left for each of an actor's processes (a config
    the nodes cannot hold, which the space prunes, fills them in turn regardless).

    >>> actors_per_node(Config(num_actors=3, envs_per_actor=2, env_parallel_degree=2), (4, 4))
    [2, 1]
    >>> actors_per_node(Config(num_actors=3, envs_per_actor=2, env_parallel_degree=2), (2, 4))
    [1, 2]
    """
    procs, free = config.processes_per_actor, list(node_cores)
    out, nxt = [0] * len(free), 0
    for _ in range(config.num_actors):
        fits = [i for i in (*range(nxt, len(free)), *range(nxt)) if free[i] >= procs]
        i = fits[0] if fits else nxt % len(free)
        free[i] -= procs
        out[i] += 1
        nxt = (i + 1) % len(free)
    return out


def collect_overhead(config: Config, prof: Profile) -> float:
    """Fixed seconds of one collect under ``config``, whatever its length: the in-process
    part, plus one per kind of process it wakes (each actor process, which the caller wakes
    and waits for in turn; env workers; replicas)."""
    if prof.backend == "serial":
        return prof.collect_seconds  # everything in the caller: nothing to wake
    actors = config.num_actors if config.num_actors > 1 or prof.backend == "ray" else 0  # ray: even one
    return (prof.collect_seconds + actors * prof.actor_collect_seconds
            + (config.env_parallel_degree > 1) * prof.env_worker_collect_seconds
            + (config.policies_per_actor > 1) * prof.replica_collect_seconds)


def cross_node_seconds(config: Config, prof: Profile) -> float:
    """Seconds per collect of the round trip to actors on other nodes than the caller's: a
    latency, then their rollouts back and the weights out over the network (nothing when
    every actor runs on the caller's node, whose object store the caller shares)."""
    if len(prof.node_cores) < 2 or not prof.num_steps:
        return 0.0
    remote = sum(actors_per_node(config, prof.node_cores)[1:])
    if not remote:
        return 0.0
    nbytes = remote * (config.envs_per_actor * prof.num_steps * (prof.obs_bytes + STEP_EXTRA_BYTES)
                       + prof.weights_bytes)
    return prof.cross_node_seconds + nbytes / prof.network_bytes_per_second


def predict(config: Config, prof: Profile) -> float:
    """Predicted env steps per second of ``config`` (see the module docstring)."""
    A, E, D, P, B = (config.num_actors, config.envs_per_actor, config.env_parallel_degree,
                     config.policies_per_actor, config.policy_batch_size)
    if prof.backend == "serial":
        # Lanes and actors all run in this process, one after another.
        te = prof.env_step_seconds + prof.env_overhead_seconds
        g = math.ceil(E / B)
        row = A * (E * te + g * prof.policy_latency(config.policy_device, B)
                   + ((D > 1) * D + (P > 1) * g) * prof.env_overhead_seconds)
    else:
        if len(prof.node_cores) > 1:
            per_actor = busy_processes(config.replace(num_actors=1))
            # max(1, ...): a head node started with 0 CPUs holds no actor unless a config
            # that fits nowhere is asked about (the space prunes it; the start config may not be).
            loads = [(a, a * per_actor, max(1, c))
                     for a, c in zip(actors_per_node(config, prof.node_cores), prof.node_cores) if a]
        else:
            loads = [(A, busy_processes(config), prof.cores)]
        # Actors run in parallel, but a collect ends with its slowest node's last row.
        row = max(_node_row_seconds(config, prof, *load) for load in loads)
    if not prof.num_steps:
        return A * E / row if row > 0 else math.inf
    collect = prof.num_steps * row + collect_overhead(config, prof) + cross_node_seconds(config, prof)
    return A * E * prof.num_steps / collect if collect > 0 else math.inf


def _node_row_seconds(config: Config, prof: Profile, actors: int, busy: int, cores: int) -> float:
    """Seconds one row of ``actors`` actors takes on a machine (or node) where they keep
    ``busy`` processes busy on ``cores`` cores: their pipeline, capped by the cores, slowed by
    time-slicing. A process waiting inside its env (a remote simulator, a sleep) holds no
    core: it counts as busy only for the share of the row it is not waiting
    (:func:`_cpu_busy`), so eight env workers of a 1 ms env that waits 85% of it contend
    like two or three (on one such env, 8 env workers measured 3,800 steps/s where counting
    each as busy predicted 2,600 and ranked 8 actors, measured 2,100-2,700, above them)."""
    row = _pipeline_row(config, prof, busy, cores)
    eff = _cpu_busy(config, prof, actors, busy, row)
    # With the cores loaded, each env step costs more CPU (fitted; 1.0 until then).
    prof = _loaded(prof, eff / cores)
    if eff < busy or prof.loaded_step_factor != 1.0:
        row = _pipeline_row(config, prof, eff, cores)
    wait = _device_wait(config, prof, actors, row)
    if wait > 0:
        row = _pipeline_row(config, prof, eff, cores, wait)
    E = config.envs_per_actor
    pipeline = actors * E / row if row > 0 else math.inf
    cpu = _cpu_per_step(config, prof)
    cap = cores / cpu if cpu > 0 else math.inf
    # Time-slicing more busy processes than cores costs context switches and cold caches.
    rate = min(pipeline, cap) / (1.0 + prof.contention * max(0.0, eff - cores) / cores)
    return actors * E / rate if rate > 0 else math.inf


def _device_wait(config: Config, prof: Profile, actors: int, row: float) -> float:
    """Seconds each forward pass waits for the device while other processes' passes hold it:
    ``device_share`` of a pass's latency holds the one device (0 on the CPU, and until
    fitted), and the processes using it (each actor with one replica, else each replica)
    queue for it. Exact mean value analysis of that closed queue: ``n`` users, each
    holding the device ``S`` per pass and away ``Z`` (the rest of its cycle) between passes."""
    share = prof.device_share
    if share <= 0 or config.policy_device.split(":")[0] == "cpu" or row <= 0:
        return 0.0
    E, P, B = config.envs_per_actor, config.policies_per_actor, config.policy_batch_size
    users = actors * (P if P > 1 else 1)
    if users < 2:
        return 0.0
    g = math.ceil(E / B)
    S = share * prof.policy_latency(config.policy_device, B)
    Z = max(0.0, row / (g / P if P > 1 else g) - S)  # each user's cycle per pass, less the pass
    q = 0.0
    for n in range(1, users + 1):
        r = S * (1.0 + q)
        q = n * r / (r + Z) if r + Z > 0 else 0.0
    return max(0.0, r - S)


def _loaded(prof: Profile, load: float) -> Profile:
    """``prof`` with its env step's CPU part stretched by
    :attr:`~auturi.tuner.profile.Profile.loaded_step_factor` in proportion to ``load`` (busy
    processes over cores, at most 1): one env alone steps at the profiled speed, a machine
    whose every core is busy at the factor's."""
    f = prof.loaded_step_factor
    if f == 1.0 or load <= 0:
        return prof
    te, frac = prof.env_step_seconds, min(1.0, max(0.0, prof.env_cpu_fraction))
    cpu = te * frac * (1.0 + (f - 1.0) * min(1.0, load))
    wall = te * (1.0 - frac) + cpu
    out = copy.copy(prof)  # not dataclasses.replace: called once per prediction, its __init__ was a sixth of a refit
    out.env_step_seconds, out.env_cpu_fraction = wall, cpu / wall if wall > 0 else frac
    return out


def _step_cpu(prof: Profile) -> float:
    """Seconds one env step computes (its CPU part, not its waits) and its bookkeeping."""
    return prof.env_step_seconds * min(1.0, max(0.0, prof.env_cpu_fraction)) + prof.env_overhead_seconds


def _cpu_per_step(config: Config, prof: Profile) -> float:
    """Seconds of CPU each env step costs, wherever it runs: the env's own share, the
    bookkeeping, its part of the forward passes and of the round trips."""
    E, D, P, B = config.envs_per_actor, config.env_parallel_degree, config.policies_per_actor, config.policy_batch_size
    g = math.ceil(E / B)
    if overlaps(config):  # the actor's host work per post and per batch (an env worker's part: its steps)
        _, parts = _overlap_parts(config)
        task_cpu, tasks_per_row = prof.post_seconds, (D - 1) * parts + g
    else:
        task_cpu = 0.5 * prof.ipc_seconds  # the busy part of a round trip, both sides
        tasks_per_row = (D - 1) * math.ceil((E // D) / B) + (g if P > 1 else 0)
    return (prof.env_step_seconds * prof.env_cpu_fraction + prof.env_overhead_seconds
            + g * prof.policy_latency(config.policy_device, B, cpu=True) / E + tasks_per_row * task_cpu / E)


def _pipeline_row(config: Config, prof: Profile, busy: float, cores: int, device_wait: float = 0.0) -> float:
    """One actor's row seconds from its pipeline alone (no core cap, no time-slicing), with
    ``busy`` processes wanting ``cores`` cores (round trips wait for a core beyond them) and
    each forward pass waiting ``device_wait`` for a device other processes hold. Layouts the
    executor runs in its overlapped loop: :func:`_overlapped_row`."""
    if overlaps(config):
        return _overlapped_row(config, prof, busy, cores, device_wait)
    E, D, P, B = config.envs_per_actor, config.env_parallel_degree, config.policies_per_actor, config.policy_batch_size
    te = prof.env_step_seconds + prof.env_overhead_seconds
    g = math.ceil(E / B)  # forward passes per row
    L = prof.policy_latency(config.policy_device, B) + device_wait
    ipc = _loaded_ipc(prof, busy, cores)
    m = E // D  # envs per env lane
    # Tasks each env lane gets per row: a lane's envs step together, so they come back ready
    # together and ride in the same batch unless the batch is smaller than the lane.
    env_tasks = math.ceil(m / B)
    if D > 1:
        # More lanes than cores: the layout spreads an actor's lanes over the cores, so k share
        # each core and take turns with their steps' CPU (their waits inside the envs
        # overlap): a lane's stepping lasts at least its core's k lanes' CPU, and the
        # cores it frees while the batch is on the device sit idle (lockstep: no lane has a
        # step to take until the actions come back). The cap by the cores alone counted those
        # idle moments as stepping: on the GPU record of 2026-11-26, 1 x 64 at degree 32 (two
        # lanes a core) read +165% from the profile alone, +72% with this (bench.model_check).
        k = math.ceil(D / cores) if cores > 0 else 1
        shared = max(0.0, k * m * _step_cpu(prof) - m * te)
        # Lock-stepped lanes wait for the slowest: the expected max of D lanes' row times
        # (each the sum of m steps; of a core's k lanes' where their CPU fills it), which grows
        # with the spread and the count.
        lag = straggle(prof, k * m, min(D, cores)) if shared > 0 else straggle(prof, m, D)
        # In the general loop (several batches, or remote replicas; with env workers that
        # is a CPU policy's) the actor steps its own share synchronously while env workers
        # finish theirs; their envs wait for it to hand them on, so each lane's cycle holds
        # the actor's share too (a 1 ms env, 16 envs, degree 8, batch 8: measured 2,900
        # steps/s, 6,600 predicted without this, 3,000 with it). Remote replicas keep acting
        # on what they were handed meanwhile: half of it.
        stall = m * te * (0.5 if P > 1 else 1.0 if g > 1 else 0.0)
        s_env = m * te + shared + stall + env_tasks * ipc + lag
    else:
        s_env = E * te
    s_pol = (g / P) * (L + ipc) if P > 1 else g * L
    if D == 1 and P == 1:
        return s_env + s_pol  # one process does both, in turn
    row = max(s_env, s_pol) + min(s_env, s_pol) / g
    # The actor itself steps its own env share and, with one replica, runs inference.
    return max(row, (m * te if D > 1 else E * te) + (g * L if P == 1 else 0.0))


def _loaded_ipc(prof: Profile, busy: float, cores: int) -> float:
    """A round trip to a worker process with ``busy`` processes wanting ``cores`` cores: a
    woken worker waits for a core beyond them."""
    return prof.ipc_seconds * (1.0 + max(0.0, busy - cores) / cores)


def _overlap_parts(config: Config) -> tuple[int, int]:
    """How the overlapped loop cuts one actor's row (:func:`~auturi.executor.actor_loop.spread_batch`):
    ``(q, parts)``: ``q`` envs of one env lane ride in one batch (the batch's fair share of
    the lane, at least one), so a lane gets ``parts`` posts a row."""
    E, D, B = config.envs_per_actor, config.env_parallel_degree, config.policy_batch_size
    m = E // D
    q = min(m, max(1, math.ceil(m * B / E)))
    return q, math.ceil(m / q)


SIM_ROWS = 32
"""At most this many rows of a collect are simulated (:func:`_overlapped_row`); a run's time
grows with them (about a millisecond for 32 envs x 32 rows). Fewer rows than the collect's
weigh its start and its end (the last env's tail) more: on the emulated box's overlapped
layouts of 2026-11-26 (64-row collects), 32 rows read 0.5-14% slower than 64."""


def _overlapped_row(config: Config, prof: Profile, busy: float, cores: int, device_wait: float = 0.0) -> float:
    """One actor's row seconds in the executor's overlapped loop (the layout plan's
    ``ActorPlan.overlap``), from a simulation of the loop's own rules
    (:func:`auturi.tuner.loop_sim.overlapped_row`: batches of the first ``B`` ready envs, the
    furthest behind first; env workers stepping what they are posted in turn; replicas side
    by side) over step times drawn from the profile (:func:`_step_draws`). The costs it is
    given: the pass's latency plus ``device_wait`` (its queue for a device other processes
    hold), a round trip slowed by ``busy`` processes on ``cores`` cores, the actor's
    ``post_seconds`` per hand-off and an env worker's half round trip per post. The actor's
    own share steps on a thread once a task of it takes ``OWN_THREAD_SECONDS``, as the loop
    decides. On the emulated GPU box's 30 overlapped measurements of 2026-11-26 (two step
    profiles, time scales 4 and 2) the predicted rates came within -14% to +25% of the
    measured ones, where the closed form it replaces (the busiest resource and one batch's
    cycle combined) ranged from -30% to +38%. It reads high more often than low: it leaves out
    the wake-up of a process blocked on its semaphore, which the fit's round trip absorbs once
    layouts are measured."""
    E, D, P, B = config.envs_per_actor, config.env_parallel_degree, config.policies_per_actor, config.policy_batch_size
    te = prof.env_step_seconds + prof.env_overhead_seconds
    L = prof.policy_latency(config.policy_device, B) + device_wait
    ipc = _loaded_ipc(prof, busy, cores)
    q, _ = _overlap_parts(config)
    rows = min(prof.num_steps or SIM_ROWS, SIM_ROWS)
    te = max(te, 1e-9)  # envs that step in no time: the row is the passes' and the hand-offs'
    # The loop's timing scales with its inputs (steps, passes and hand-offs twice as long: a
    # row twice as long), so it is simulated in units of a mean step. The simulation runs at
    # costs rounded to COST_STEP and its row is carried to the exact costs by the bound
    # (:func:`_overlap_bound`) moving between them: a refit's candidates, which differ in one
    # cost, mostly share a run (a run is about a millisecond; a refit weighs over a thousand).
    threaded = q * te >= OWN_THREAD_SECONDS
    l, i, p = L / te, ipc / te, prof.post_seconds / te
    lb, ib, pb = _bucket(l, COST_STEP), _bucket(i, HANDOFF_STEP), _bucket(p, HANDOFF_STEP)
    sim = _simulated_row(E, D, P, B, rows, _step_shape(prof), lb, ib, pb, threaded)
    return te * sim * _overlap_bound(config, l, i, p, threaded) / _overlap_bound(config, lb, ib, pb, threaded)


def _overlap_bound(config: Config, L: float, ipc: float, post: float, own_threaded: bool) -> float:
    """The least row the overlapped loop could take, in units of a mean step (``L``, ``ipc``,
    ``post``: the pass, the round trip and the actor's cost per hand-off, in steps): the
    busiest of an env worker (its ``m`` steps and posts), the replicas side by side, the
    actor (its own share unless on its thread, its passes with one replica, its hand-offs),
    and one env's cycle (a step, a pass, the round trips)."""
    E, D, P, B = config.envs_per_actor, config.env_parallel_degree, config.policies_per_actor, config.policy_batch_size
    m, g = E // D, math.ceil(E / B)
    q, parts = _overlap_parts(config)
    lanes = m + parts * 0.5 * ipc
    device = (g / P) * (L + ipc) if P > 1 else 0.0
    actor = ((0.0 if own_threaded else m) + (g * L if P == 1 else 0.0)
             + ((D - 1) * parts + g) * post)
    cycle = q + L + ipc * (2.0 if P > 1 else 1.0)
    return max(lanes, device, actor, cycle)


COST_STEP, HANDOFF_STEP = 0.1, 1.0
"""The simulation's pass latency (in steps) is rounded to a power of ``1 + COST_STEP``, its
hand-off costs (round trip, the actor's post) to a power of ``1 + HANDOFF_STEP``; between those
the closed-form bound carries the row (:func:`_overlapped_row`)."""


def _bucket(x: float, step: float) -> float:
    """``x`` rounded to the nearest power of ``1 + step`` (0 stays 0)."""
    if x <= 0:
        return 0.0
    k = math.log1p(step)
    return float(math.exp(round(math.log(x) / k) * k))


def _step_shape(prof: Profile) -> tuple[float, ...]:
    """The profile's step times over their mean: its quantiles where profiling took them,
    else a lognormal of its coefficient of variation (``("lognormal", cv)``); 0 steps wait
    no time."""
    if prof.env_step_quantiles:
        q = np.asarray(prof.env_step_quantiles, dtype=np.float64)
        mean = float(q.mean())
        return tuple(float(x) for x in q / mean) if mean > 0 else (1.0,)
    mean = prof.env_step_seconds
    return (-1.0, round(prof.env_step_std / mean, 3) if mean > 0 else 0.0)  # -1: a lognormal's marker


def _step_draws(shape: tuple[float, ...], envs: int, rows: int) -> np.ndarray:
    """``(envs, rows)`` step times over their mean, drawn from ``shape`` (:func:`_step_shape`),
    seeded: the same draws, and so the same prediction, every call."""
    rng = np.random.default_rng(0)
    if shape and shape[0] < 0:  # a lognormal of mean 1 and coefficient of variation shape[1]
        s2 = math.log1p(shape[1] ** 2)
        return rng.lognormal(-s2 / 2, math.sqrt(s2), size=(envs, rows))
    q = np.asarray(shape, dtype=np.float64)
    return q[rng.integers(0, len(q), size=(envs, rows))]


@functools.lru_cache(maxsize=8192)
def _simulated_row(E: int, D: int, P: int, B: int, rows: int, shape: tuple[float, ...], L: float, ipc: float,
                   post: float, own_threaded: bool) -> float:
    """:func:`~auturi.tuner.loop_sim.overlapped_row` in units of a mean step."""
    return overlapped_row(E, D, P, B, _step_draws(shape, E, rows), latency=L, ipc=ipc, post=post,
                          lane_cpu=0.5 * ipc, own_threaded=own_threaded)


BARRIER_IDLE = 0.5
"""The share of a lockstep lane's wait at the barrier (the expected lag of the slowest of its
actor's lanes, :func:`straggle`) that :func:`_cpu_busy` counts as holding no core. Blocked on
its semaphore a process holds none for all of it, but each wake-up of a blocked process on a
loaded machine costs a core too, which the row does not price: on the emulated GPU box
(2026-11-26, 2 cores, 10 lockstep layouts in three records) counting none of the wait left
2 x 16 at degree 16 (32 processes) 22-38% low, counting all of it left the straggler rows
up to 52% high, and half kept all 30 within 25% (-24% to +21%)."""


def _cpu_busy(config: Config, prof: Profile, actors: int, busy: int, row: float) -> float:
    """``busy`` processes less the share of the row each spends holding no core:

    - every env-stepping process (each actor and its env workers) while it waits inside its
      envs: ``(1 - env_cpu_fraction)`` of their step time;
    - with the policy on a device other than the CPU, in the actor (one replica) and with
      env workers: the env workers while their batch is on the device (each row's forward
      passes; on the CPU the policy's torch threads take those cores, so they count busy);
    - device replicas of their own (several replicas) except while they run their share of
      the forward passes, at the CPU cost the profile timed for them (a CUDA call that
      spins on its result holds its core for all of it; an emulated device for little).

    CPU replicas count whole. In the overlapped loop (no barrier) every process counts only
    for its CPU work: an env worker's steps' CPU and posts, the actor's share, host work and
    (one replica) passes' CPU, each replica's passes' CPU; blocked on its semaphore it holds
    no core."""
    if row <= 0:
        return float(busy)
    E, D, P, B = config.envs_per_actor, config.env_parallel_degree, config.policies_per_actor, config.policy_batch_size
    frac = min(1.0, max(0.0, prof.env_cpu_fraction))
    wait = prof.env_step_seconds * (1.0 - frac)
    m = E // D
    device = config.policy_device.split(":")[0] != "cpu"
    g = math.ceil(E / B)
    share = min(1.0, (g / P) * prof.policy_latency(config.policy_device, B, cpu=True) / row) if P > 1 else 0.0
    if overlaps(config):
        # No barrier: a process holds a core for its CPU work and blocks on its semaphore
        # otherwise (an env worker whose envs are all in inference or in a forming batch).
        _, parts = _overlap_parts(config)
        step_cpu = _step_cpu(prof)
        worker = min(1.0, (m * step_cpu + parts * 0.5 * prof.ipc_seconds) / row)
        host = ((D - 1) * parts + g) * prof.post_seconds
        inference = g * prof.policy_latency(config.policy_device, B, cpu=True) if P == 1 else 0.0
        actor = min(1.0, (m * step_cpu + host + inference) / row)
        return max(1.0, actors * ((D - 1) * worker + actor + (P * share if P > 1 else 0.0)))
    # Per env-stepping process: its envs' waits, and (lockstep lanes, the policy on a device)
    # its share of the barrier's wait for the slowest lane (BARRIER_IDLE of the expected lag;
    # with CPU inference the policy's torch threads take the cores the waiting lanes leave).
    barrier = BARRIER_IDLE * straggle(prof, m, D) / row if D > 1 and device else 0.0
    own = min(1.0, m * wait / row + barrier)
    worker = own
    if device and P == 1 and D > 1:
        worker = min(1.0, own + g * prof.policy_latency(config.policy_device, B) / row)
    idle = actors * (own + (D - 1) * worker)
    if device and P > 1:
        idle += actors * P * (1.0 - share)
    return max(1.0, busy - idle)



# ---------------------------------------------------------------------------- the fit
def fit_overheads(prof: Profile, measured: Iterable[tuple[Config, float]], sweeps: int = 8) -> Profile:
    """``prof`` with the costs profiling cannot time (``ipc_seconds``,
    ``env_overhead_seconds``, ``contention``; with ``num_steps`` known, the per-collect costs
    of each layout family; across nodes, the round trip's latency and the network's rate)
    fitted to measured throughputs: least squares on log throughput, with a weak pull to
    ``prof``'s own values (the defaults, unless set) so a cost no measured config exercised
    stays where it was. Coordinate descent over a log grid per cost."""
    pts = [(c, float(v)) for c, v in measured if v and math.isfinite(v) and v > 0]
    if not pts:
        return prof
    grids = dict(_GRIDS)
    if all(c.policy_device.split(":")[0] == "cpu" for c, _ in pts):
        # No measured config queued for a device: nothing to fit device_share to. And the
        # loaded step factor is identified where the cores do little but step envs (the
        # policy on a device); with CPU inference it is confounded with inference's threads
        # and with contention, which the CPU runs were calibrated with (2026-11-26: fitting
        # it there moved the synthetic strategy test's choice below 95% of the best).
        del grids["device_share"], grids["loaded_step_factor"]
    if not any(overlaps(c) for c, _ in pts):
        del grids["post_seconds"]  # only the overlapped loop pays it: nothing measured says what it is
    if prof.num_steps:  # without a collect length, per-collect costs do not enter a prediction
        grids.update(_COLLECT_GRIDS)
        if len(prof.node_cores) > 1:
            grids.update(_NODE_GRIDS)
    prior = {k: getattr(prof, k) for k in grids}
    seen: dict[tuple[float, ...], float] = {}  # the descents revisit points (a grid's current value, the second order's start)

    def loss(p: Profile) -> float:
        at = tuple(getattr(p, k) for k in grids)
        if at not in seen:
            seen[at] = _loss(p)
        return seen[at]

    def _loss(p: Profile) -> float:
        err = 0.0
        for c, v in pts:
            y = predict(c, p)
            err += (math.log(y) - math.log(v)) ** 2 if y > 0 and math.isfinite(y) else 1e6
        for k, d in prior.items():
            weight = _PRIOR_WEIGHT if k in _GRIDS else _WEAK_PRIOR_WEIGHT
            if k in _LINEAR_PRIORS:
                err += weight * (getattr(p, k) - d) ** 2
                continue
            err += weight * math.log((getattr(p, k) + 1e-6) / (d + 1e-6)) ** 2
        return err

    # Per-step and per-collect costs trade off (a 1-step collect's hand-offs are both), so
    # coordinate descent ends where it starts moving first: descend in both orders, keep the better.
    orders = [list(grids)]
    if len(grids) > len(_GRIDS):
        orders.append([k for k in grids if k not in _GRIDS] + [k for k in grids if k in _GRIDS])
    best = min((_descend(prof, grids, order, loss, sweeps) for order in orders), key=loss)
    # Then finer steps around where the grids ended (they are coarse, to keep a refit cheap).
    for factor in (1.5, 1.2, 1.08):
        near = {k: sorted(x for x in {getattr(best, k) * factor ** j for j in (-1, 1)} - {0.0}
                          if _BOUNDS.get(k, (0.0, math.inf))[0] <= x <= _BOUNDS.get(k, (0.0, math.inf))[1])
                for k in grids}
        best = _descend(best, near, list(grids), loss, 2)
    return best


def _descend(prof: Profile, grids: dict[str, list[float]], order: list[str], loss: Any, sweeps: int) -> Profile:
    """Coordinate descent on ``loss`` over ``grids``, one cost at a time in ``order``."""
    best, best_err = prof, loss(prof)
    for _ in range(sweeps):
        improved = False
        for k in order:
            for x in grids[k]:
                cand = replace(best, **{k: x})
                e = loss(cand)
                if e < best_err - 1e-12:
                    best, best_err, improved = cand, e, True
        if not improved:
            break
    return best

