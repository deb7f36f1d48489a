"""The online tuner's payback rule, as pure functions: does trying another layout pay for
itself before the training ends?

A move's **benefit** is the seconds it saves: each collect left after the trial's warm-up
(its measured collects run at the new layout too) faster by the gain the model predicts over
the best measured config, times the share of their promise this run's trials delivered
(:func:`discount`; one half before any). Its **cost**: reconfiguring there and back, each
priced by the processes it starts at what a started process cost in this run, and by the CUDA
contexts they make at what one cost in this run (:func:`reconfigure_estimate`; before any, the
priors, a process's start shared out over the machine's cores), a worker server's start where
its processes need one, and the trial's warm-up and first sample at half speed; once search trials ran, at least what they
cost on average. A gain below ``min_gain`` weighs nothing. :class:`~auturi.tuner.OnlineTuner`
gathers the inputs (its trials, the executor's ``move_cost``) and records what it declines;
:func:`declined_now_paying` re-reads such a record for a longer run.

Example (a 20% faster layout, 100 collects of 0.5 s left, two processes to start):
    >>> per = benefit_per_collect(1250.0, 1000.0, collect_steps=500, discount=0.5, min_gain=0.05)
    >>> there = reconfigure_estimate([], started=2)
    >>> benefit, cost = payback(left=100, per_collect=per, warmup_collects=1, collect_seconds=0.5,
    ...                         there_seconds=there, back_seconds=RECONFIGURE_BASE)
    >>> round(per, 3), round(benefit, 2), round(cost, 2), pays_back(benefit, cost)
    (0.05, 4.95, 0.86, True)
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from auturi.config import Config

PROCESS_START_PRIOR = 0.15
"""Seconds one worker process is assumed to add to a reconfigure before this run measured one
(forked warm from a forkserver: 0.05-0.2 s on a 2-core machine; cold, it was 0.5-2 s)."""
SERVER_START_PRIOR = 1.0
"""Seconds of training a worker forkserver's start costs (its imports, torch's above all,
share the cores with the training for a few seconds), charged to a trial whose processes
fork from a server not started yet."""
CUDA_START_PRIOR = 3.0
"""Seconds one process that initialises a CUDA device (a CUDA replica's or actor's process,
or the caller's policy moving to a GPU) adds to a reconfigure before this run measured one:
CUDA's context start. The GPU record of 2026-11-26 (one H200, 16 cores) has no direct timing;
its first CUDA trial's reconfigure took 3.52 s for two CUDA processes plus 30 env workers that
later took 0.64-1.0 s alone: 1.3-1.5 s per context, 2.5-3 s where one starts alone. Priced
without it, a move to eight CUDA actors looked as cheap as one to eight env workers."""
PRIOR_CORES = 2
"""Cores of the machine ``PROCESS_START_PRIOR`` was measured on: processes started together
share the cores, so on ``c`` cores ``k`` of them take about ``k * 2 / c`` times the prior (the
GPU record's 30 env workers on 16 cores: 0.64-1.0 s, where ``k`` times the prior said 4.5 s)."""
RECONFIGURE_BASE = 0.03
"""Seconds a reconfigure costs besides starting processes (new control block, moving envs)."""
DISCOUNT_PRIOR = 0.5
"""The share of a predicted gain a trial is expected to deliver before any was measured,
worth one trial (the model's optimistic bound would make a short run pay for trials only a
long one can afford)."""


def reconfigure_estimate(reconfigures: Sequence[Mapping[str, Any]], started: int, devices: int = 0,
                         cores: int | None = None) -> float:
    """Seconds a reconfigure that starts ``started`` processes, ``devices`` of them initialising
    a CUDA device, should take, from this run's ``reconfigures`` (the tuner's log: ``{"seconds",
    "executor": last_reconfigure, "cold", "devices"}``):

    - ``RECONFIGURE_BASE``, plus ``started - devices`` times the median seconds per started
      process of the reconfigures that initialised no device (one that also started its
      processes' server, ``cold``, left out: it paid 1-2 s of imports no later one pays); before
      any, :func:`start_prior` (``PROCESS_START_PRIOR``, scaled by the processes per core);
    - plus ``devices`` times the median seconds per device of those that did (their time beyond
      what their other processes cost, by the rate above), ``CUDA_START_PRIOR`` before any.

    For an executor that does not report what it started, the median of its reconfigures.

    >>> reconfigure_estimate([{"seconds": 0.43, "executor": {"started": 2}}], started=4)
    0.89
    >>> reconfigure_estimate([{"seconds": 2.0, "executor": {"started": 2}, "cold": True}], 4) == 0.03 + 4 * 0.15
    True
    >>> reconfigure_estimate([], started=31, cores=16) == 0.03 + 0.15 * 31 * 2 / 16
    True
    >>> round(reconfigure_estimate([{"seconds": 1.23, "executor": {"started": 1}, "devices": 1}], 2, devices=2), 2)
    2.43
    """
    warm = [r for r in reconfigures if r.get("executor", {}).get("started") and not r.get("cold")]
    plain = [r["seconds"] / r["executor"]["started"] for r in warm if not r.get("devices")]
    if not warm:
        whole = [r["seconds"] for r in reconfigures if "executor" not in r]  # one that does not say what it started
        if whole:
            return statistics.median(whole)
    per = statistics.median(plain) if plain else None
    others = max(0, started - devices)
    cost = RECONFIGURE_BASE + (others * per if per is not None else start_prior(others, cores))
    if devices:
        dev = [(r["seconds"] - RECONFIGURE_BASE
                - (r["executor"]["started"] - r["devices"]) * (per if per is not None else PROCESS_START_PRIOR))
               / r["devices"] for r in warm if r.get("devices")]
        cost += devices * (max(0.0, statistics.median(dev)) if dev else CUDA_START_PRIOR)
    return cost


def start_prior(started: int, cores: int | None = None) -> float:
    """Seconds ``started`` processes started together are assumed to take before this run
    measured one: ``PROCESS_START_PRIOR`` each on ``PRIOR_CORES`` cores, sharing ``cores``
    (None: as on the prior's machine), never less than one process's start.

    >>> start_prior(4), start_prior(4, cores=16), start_prior(32, cores=16)
    (0.6, 0.15, 0.6)
    """
    if started <= 0:
        return 0.0
    if cores is None or cores <= PRIOR_CORES:
        return started * PROCESS_START_PRIOR
    return PROCESS_START_PRIOR * max(1.0, started * PRIOR_CORES / cores)


def discount(realized: Sequence[float]) -> float:
    """How much of a predicted gain a trial is expected to deliver: the mean of this run's
    realized fractions (:func:`realized_fraction`) with a prior of ``DISCOUNT_PRIOR`` worth
    one trial. A model that keeps promising more than the measurements give (a cheap env,
    where every layout is within noise of serial) stops the search.

    >>> discount([]), discount([0.0, 0.0, 0.0])
    (0.5, 0.125)
    """
    return (DISCOUNT_PRIOR + sum(realized)) / (1 + len(realized))


def realized_fraction(promised_gain: float, best_then: float, measured: float | None) -> float:
    """The share of ``promised_gain`` (a fraction over ``best_then`` steps/s) that a trial
    measured at ``measured`` steps/s delivered, clipped to [0, 1] (None or 0: a failed trial,
    nothing).

    >>> realized_fraction(0.5, 1000.0, 2000.0), realized_fraction(0.5, 1000.0, 900.0)
    (1.0, 0.0)
    """
    got = 1.0 - best_then / measured if measured and measured > 0 else -1.0
    return min(1.0, max(0.0, got / promised_gain))


def benefit_per_collect(pred: float | None, best: float | None, *, collect_steps: int, discount: float,
                        min_gain: float) -> float:
    """Seconds each collect of ``collect_steps`` steps would save at ``pred`` steps/s against
    the best measured ``best``, times ``discount``; 0 when either is unknown or the gain is
    below ``min_gain`` (within noise).

    >>> benefit_per_collect(1040.0, 1000.0, collect_steps=1000, discount=1.0, min_gain=0.05)
    0.0
    """
    if not best or not pred or not math.isfinite(pred):
        return 0.0
    gain = max(0.0, 1.0 - best / pred)
    if gain < min_gain:
        return 0.0
    return discount * gain * collect_steps / best


def payback(*, left: int, per_collect: float, warmup_collects: int, collect_seconds: float, there_seconds: float,
            back_seconds: float, server_start: bool = False, search_trials: int = 0,
            trial_cost: float = 0.0) -> tuple[float, float]:
    """``(benefit, cost)`` in seconds of trying a layout with ``left`` collects to go.

    Benefit: ``per_collect`` (:func:`benefit_per_collect`) for each collect after the trial's
    ``warmup_collects``. Cost: ``there_seconds`` and ``back_seconds`` (the reconfigures, each
    :func:`reconfigure_estimate` of the processes it starts: back to fewer processes starts
    none), the warm-up and the first sample at half the current ``collect_seconds`` (a slower
    trial stops after its first sample), ``SERVER_START_PRIOR`` when its processes' server must
    start; at least ``trial_cost / search_trials`` (what this run's search trials really cost,
    slow collects included) once any ran. ``(0, 0)`` when there is no benefit to weigh.
    """
    if not per_collect:
        return 0.0, 0.0
    benefit = per_collect * max(0, left - warmup_collects)
    cost = there_seconds + back_seconds + 0.5 * collect_seconds * (warmup_collects + 1)
    if server_start:
        cost += SERVER_START_PRIOR
    if search_trials:
        cost = max(cost, trial_cost / search_trials)
    return benefit, cost


def pays_back(benefit: float, cost: float, factor: float = 1.0) -> bool:
    """Whether a move's ``benefit`` exceeds ``factor`` times its ``cost`` (and is positive).

    >>> pays_back(2.0, 1.5), pays_back(2.0, 1.5, factor=2.0), pays_back(0.0, 0.0)
    (True, False, False)
    """
    return benefit > factor * cost and benefit > 0


def declined_now_paying(declined: Sequence[Mapping[str, Any]], left: int | None) -> Mapping[str, Any] | None:
    """The first declined move (an entry of ``OnlineTuner.declined``) that pays back over
    ``left`` collects: its benefit grows with the collects left (the cost does not), at
    ``benefit_per_collect`` each where recorded (a move declined with no collect left to
    gain on still has one), else scaled from the benefit computed for the collects it had
    left then. ``left`` None (unknown): any declined move with a benefit. None when there is
    none.

    >>> d = {"benefit_seconds": 0.0, "benefit_per_collect": 0.1, "cost_seconds": 2.0, "collects_left": 1}
    >>> declined_now_paying([d], 10) is None, declined_now_paying([d], 40) is d
    (True, True)
    """
    for d in declined:
        try:
            benefit, cost, then = float(d["benefit_seconds"]), float(d["cost_seconds"]), d["collects_left"]
            per = float(d["benefit_per_collect"]) if d.get("benefit_per_collect") is not None else None
        except (KeyError, TypeError, ValueError):
            continue
        if per is None:
            per = benefit / float(then) if then else 0.0
        if not (per > 0 and math.isfinite(cost)):
            continue
        if left is None or per * left > cost:
            return d
    return None


def cached_search_open(online: Mapping[str, Any] | None, left: int | None) -> str | None:
    """Why a cached record's search is not the answer for a run with ``left`` collects to go
    (``online``: the record's ``online`` part; None for an offline record, which searched
    whatever the length), or None when it is. A record is a run's verdict for its own length (a
    2,000-step smoke run cached serial for an env whose 8 env workers collect 4x faster, and
    every later run locked it in): the search goes on when that run never locked in, or when
    one of its declined moves pays back over ``left`` (:func:`declined_now_paying`).

    >>> cached_search_open({"locked": False}, 100)
    'the run that cached it ended before it locked in'
    >>> d = {"config": {"num_actors": 2, "envs_per_actor": 4}, "benefit_seconds": 0.0, "benefit_per_collect": 0.1,
    ...      "cost_seconds": 2.0, "collects_left": 3}
    >>> cached_search_open({"locked": True, "declined": [d]}, 10) is None
    True
    >>> cached_search_open({"locked": True, "declined": [d]}, 40)[:41]
    'the run that cached it declined actors=2 '

    """
    if online is None:
        return None
    if online.get("locked") is False:
        return "the run that cached it ended before it locked in"
    d = declined_now_paying(online.get("declined") or [], left)
    if d is None:
        return None
    return (f"the run that cached it declined {Config.from_dict(d['config'])} with {d['collects_left']} collects "
            f"left, which pays back over this run's {left_text(left)}")


def cache_verdict(ok: bool, estimate: float, cached: float | None, tolerance: float,
                  online: Mapping[str, Any] | None, left: int | None) -> str | None:
    """After a cached choice's trial (``ok``; ``estimate`` steps/s): None when it is confirmed,
    within ``tolerance`` of its ``cached`` throughput (or none was cached) and the cached
    record's search binds a run of ``left`` collects (:func:`cached_search_open`; ``online``:
    the record's ``online`` part); else why the search runs (it follows "cached choice <config> ").

    >>> cache_verdict(True, 950.0, 1000.0, 0.1, None, 100) is None
    True
    >>> cache_verdict(True, 800.0, 1000.0, 0.1, None, 100)
    'measured 800 steps/s, not within 10% of its cached 1,000: searching'
    """
    if ok and (cached is None or estimate >= (1 - tolerance) * cached):
        why = cached_search_open(online, left)
        return None if why is None else f"confirmed at {_steps(estimate)} steps/s, but {why}: searching on from it"
    return (f"measured {_steps(estimate)} steps/s, not within {tolerance:.0%} of its cached "
            f"{_steps(cached or math.nan)}: searching")


def _steps(x: float) -> str:
    return f"{x:,.0f}" if math.isfinite(x) else "?"


def left_text(left: int | None) -> str:
    """``left`` collects, in words."""
    return "an unknown number of collects" if left is None else f"{left} collects"
