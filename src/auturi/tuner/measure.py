"""The measurement protocol every strategy shares, and the :class:`Trial` it produces.

Over 400 lines on purpose: the trial record, its interval statistics and the protocols
that fill it (one config, interleaved rounds, sample by sample online) are one vocabulary.

One trial of a config:

1. ``executor.reconfigure(config)``, timed and reported apart from throughput;
2. one warm-up collect (``warmup_collects``), discarded: it pays for first-touch page faults,
   lazily built models and caches, and would bias the estimate;
3. measured collects until the interval of the estimate is within ``rel_half_width`` of it
   (after ``min_samples``), or a cap is hit (``max_samples``, ``max_seconds``, or the tuner's
   deadline).

Throughput is env steps per wall second (``rollout.stats``); offline, one sample is as many
back-to-back collects as last ``min_sample_seconds``, and their steps over their seconds.
In the interleaved rounds whose numbers are printed (the offline tuner's confirm rounds) a
sample is also at least :func:`collects_per_sample` collects, sized from the spread of the
config's single collects: with heavy-tailed envs most short samples miss the rare slow
steps, so their median is above the long-run rate a learner sees, and by how much depends
on the config; samples that each hold several slow steps have a median at their mean.
Every sample, and offline every collect in it, is kept, so a results file can be re-analysed.

The statistics are robust (:func:`median_interval`): the estimate is the **median** of the
samples, so one collect that a neighbour's job stalled does not move it, and its interval is
the distribution-free order-statistic interval for the median, valid for any distribution
and any sample size: ``[x(k), x(n+1-k)]`` of the sorted samples covers the true median with
probability ``1 - 2 P(Binomial(n, 1/2) < k)``. It needs at least 3 samples
(:data:`MIN_INTERVAL_SAMPLES`); below 6 samples no such interval reaches 95%, so it is the
samples' range with its exact confidence (75% at 3, 88% at 4, 94% at 5), and from 6 the
narrowest with at least 95%. The confidence is reported with every interval.

Example:
    >>> from auturi.tuner.measure import median_interval
    >>> median_interval([100.0, 102.0, 98.0, 99.0, 670.0])  # the outlier does not move it
    (100.0, 98.0, 670.0, 0.9375)
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from auturi.config import Config
from auturi.errors import ConfigError

MIN_INTERVAL_SAMPLES = 3
"""No interval is given for fewer samples: two cannot show an outlier."""


def _below_prob(k: int, n: int) -> float:
    """P(Binomial(n, 1/2) < k)."""
    return sum(math.comb(n, i) for i in range(k)) / 2.0 ** n


def median_interval(samples: Sequence[float], level: float = 0.95) -> tuple[float, float, float, float]:
    """The median of ``samples`` and its distribution-free interval: ``(median, low, high,
    confidence)``. The interval is the narrowest order-statistic one whose confidence is at
    least ``level``; with too few samples for that, the samples' range and its (lower)
    confidence. Below :data:`MIN_INTERVAL_SAMPLES` samples: ``(median, -inf, inf, nan)``
    (``nan`` median without samples)."""
    xs = sorted(float(x) for x in samples)
    n = len(xs)
    if n == 0:
        return math.nan, -math.inf, math.inf, math.nan
    med = statistics.median(xs)
    if n < MIN_INTERVAL_SAMPLES:
        return med, -math.inf, math.inf, math.nan
    k, conf = 1, 1 - 2 * _below_prob(1, n)
    for j in range(2, n // 2 + 1):
        c = 1 - 2 * _below_prob(j, n)
        if c < level:
            break
        k, conf = j, c
    return med, xs[k - 1], xs[n - k], conf


def ratio(a: Trial | None, b: Trial | None) -> float:
    """``a``'s estimate over ``b``'s (``nan`` when either is missing or not ok)."""
    if a is None or b is None or not (a.ok and b.ok) or not b.estimate > 0:
        return math.nan
    return a.estimate / b.estimate


@dataclass
class MeasureProtocol:
    """When to stop measuring one config."""

    rel_half_width: float = 0.05
    """Stop once both ends of the estimate's interval are within this fraction of it."""
    min_samples: int = 3
    """Measured collects before the rule may stop (an interval needs 3 whatever this says)."""
    max_samples: int = 10
    """Cap on measured collects."""
    max_seconds: float | None = 20.0
    """Cap on one trial's wall seconds of collects, warm-up included, reconfigure not (None:
    no cap). At least one measured collect is always taken."""
    warmup_collects: int = 1
    """Collects after a reconfigure whose throughput is discarded."""
    min_sample_seconds: float = 0.05
    """Offline, one sample is as many back-to-back collects as last this long (at least one;
    at most :data:`MAX_COLLECTS_PER_SAMPLE`). A collect of a cheap env lasts a few
    milliseconds, and single collects that short varied 10-30% on a shared 2-core VM, so
    printed ratios built on them disagreed with a re-measure by 14-40%. Online, a sample is
    always one training collect (the learner decides its length)."""

    def __post_init__(self) -> None:
        if not 0 < self.rel_half_width < 1:
            raise ValueError(f"rel_half_width must be in (0, 1), got {self.rel_half_width}")
        if self.min_samples < 2:
            raise ValueError(f"min_samples must be >= 2 (an interval needs {MIN_INTERVAL_SAMPLES} samples), "
                             f"got {self.min_samples}")
        if self.max_samples < self.min_samples:
            raise ValueError(f"max_samples ({self.max_samples}) must be >= min_samples ({self.min_samples})")
        if self.warmup_collects < 0:
            raise ValueError(f"warmup_collects must be >= 0, got {self.warmup_collects}")
        if not self.min_sample_seconds >= 0:
            raise ValueError(f"min_sample_seconds must be >= 0, got {self.min_sample_seconds}")

    def to_dict(self) -> dict[str, Any]:
        return {"rel_half_width": self.rel_half_width, "min_samples": self.min_samples,
                "max_samples": self.max_samples, "max_seconds": self.max_seconds,
                "warmup_collects": self.warmup_collects, "min_sample_seconds": self.min_sample_seconds}


def _num(x: float | None) -> float | None:
    """JSON has no inf/nan: write them as null."""
    return None if x is None or not math.isfinite(x) else float(x)


@dataclass
class Trial:
    """The measurements of one config.

    ``samples`` are steps/s of the measured collects; ``warmup`` those of the discarded
    ones. ``status`` is ``"running"``, ``"ok"`` (has samples), ``"invalid"`` (the executor
    refused the config; the executor is still usable) or ``"failed"`` (a worker failed; the
    executor has closed itself). ``source`` says why it was measured: ``start``, ``serial``,
    ``cache``, ``search``, ``final`` (the interleaved re-measure), ``online``, ``research``.
    """

    config: Config
    samples: list[float] = field(default_factory=list)
    warmup: list[float] = field(default_factory=list)
    reconfigure_seconds: float = 0.0
    status: str = "running"
    stop_reason: str = ""
    error: str | None = None
    source: str = ""
    predicted: float | None = None
    """The model strategy's prediction (steps/s) when it proposed this config."""
    started: float = 0.0
    """Seconds since tuning began when this trial began."""
    seconds: float = 0.0
    """Wall seconds the trial took, reconfigure and warm-up included."""
    reconfigure: dict[str, Any] | None = None
    """What the executor reported of the reconfigure into this config (its
    ``last_reconfigure``: seconds, processes kept/started/ended, envs moved/recreated), when
    it reports one."""
    collect_rates: list[float] = field(default_factory=list)
    """Steps/s of each single collect inside the measured samples (offline; one sample may
    aggregate several): their spread sizes later samples (:func:`collects_per_sample`)."""
    collects_per_sample: int = 1
    """The collects one measured sample aggregates at least (see :func:`collects_per_sample`)."""
    sample_collects: list[int] = field(default_factory=list, repr=False, compare=False)
    """How many of ``collect_rates`` each sample holds (offline interleaved rounds; not saved)."""
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def stats(self) -> tuple[float, float, float, float]:
        """``(estimate, low, high, confidence)``: see :func:`median_interval`."""
        return median_interval(self.samples)

    @property
    def estimate(self) -> float:
        """The robust throughput estimate: the median of the samples (steps/s)."""
        return self.stats[0]

    @property
    def low(self) -> float:
        """Lower end of the estimate's interval (``-inf`` below 3 samples)."""
        return self.stats[1]

    @property
    def high(self) -> float:
        """Upper end of the estimate's interval (``inf`` below 3 samples)."""
        return self.stats[2]

    @property
    def confidence(self) -> float:
        """The interval's exact confidence (``nan`` below 3 samples)."""
        return self.stats[3]

    @property
    def mean(self) -> float:
        """The arithmetic mean (kept for re-analysis; choices use :attr:`estimate`)."""
        return statistics.fmean(self.samples) if self.samples else math.nan

    @property
    def half_width(self) -> float:
        """The larger distance from the estimate to an end of its interval (``inf`` below
        3 samples)."""
        m, lo, hi, _ = self.stats
        return max(m - lo, hi - m) if math.isfinite(lo) else math.inf

    @property
    def rel_half_width(self) -> float:
        m = self.estimate
        return self.half_width / m if m and math.isfinite(m) else math.inf

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.samples)

    def score(self) -> float:
        """The estimate for ranking; ``-inf`` for a trial that cannot be chosen."""
        return self.estimate if self.ok else -math.inf

    def to_dict(self) -> dict[str, Any]:
        m, lo, hi, conf = self.stats
        return {
            "config": self.config.to_dict(), "source": self.source, "status": self.status,
            "stop_reason": self.stop_reason, "error": self.error, "median": _num(m), "low": _num(lo),
            "high": _num(hi), "confidence": _num(conf), "mean": _num(self.mean),
            "half_width": _num(self.half_width), "n": self.n, "samples": list(self.samples),
            "warmup": list(self.warmup), "reconfigure_seconds": self.reconfigure_seconds,
            "predicted": _num(self.predicted), "started": self.started, "seconds": self.seconds,
            "collect_rates": list(self.collect_rates), "collects_per_sample": self.collects_per_sample,
            **({"reconfigure": dict(self.reconfigure)} if self.reconfigure else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trial:
        return cls(config=Config.from_dict(d["config"]), samples=list(d.get("samples", [])),
                   warmup=list(d.get("warmup", [])), reconfigure_seconds=d.get("reconfigure_seconds", 0.0),
                   status=d.get("status", "ok"), stop_reason=d.get("stop_reason", ""), error=d.get("error"),
                   source=d.get("source", ""), predicted=d.get("predicted"), started=d.get("started", 0.0),
                   seconds=d.get("seconds", 0.0), reconfigure=d.get("reconfigure"),
                   collect_rates=list(d.get("collect_rates", [])),
                   collects_per_sample=int(d.get("collects_per_sample", 1)))

    def interval_text(self) -> str:
        """``"[low, high] 94%"``, or ``""`` without an interval."""
        m, lo, hi, conf = self.stats
        if not math.isfinite(lo):
            return ""
        return f"[{lo:,.0f}, {hi:,.0f}] {conf:.0%}"

    def __str__(self) -> str:
        if not self.ok:
            return f"{self.config}: {self.status} {self.error or ''}".rstrip()
        iv = self.interval_text()
        return f"{self.config}: {self.estimate:,.0f}{' ' + iv if iv else ''} steps/s (n={self.n}, {self.source})"


MAX_COLLECTS_PER_SAMPLE = 64
"""Cap on the collects one offline sample aggregates (see ``MeasureProtocol.min_sample_seconds``)."""


def sample_throughput(executor: Any, num_steps: int, steps: int, min_seconds: float,
                      clock: Callable[[], float], min_collects: int = 1,
                      collect_rates: list[float] | None = None) -> float:
    """One offline sample: collects back to back until they have lasted ``min_seconds`` and
    numbered ``min_collects`` (at least one, at most :data:`MAX_COLLECTS_PER_SAMPLE`), and
    their total steps over their total seconds (each collect timed by the executor's own
    stats when present, as :func:`throughput_of` does). Each collect's own steps/s is
    appended to ``collect_rates`` when given."""
    total_steps, total_seconds = 0, 0.0
    for i in range(MAX_COLLECTS_PER_SAMPLE):
        c0 = clock()
        rollout = executor.collect(num_steps)
        wall = clock() - c0
        stats = getattr(rollout, "stats", None)
        seconds = float(stats.seconds) if stats is not None and getattr(stats, "seconds", None) else wall
        total_steps, total_seconds = total_steps + steps, total_seconds + seconds
        if collect_rates is not None and seconds > 0:
            collect_rates.append(steps / seconds)
        if total_seconds <= 0:  # a fake clock that never moves: one collect
            break
        if total_seconds >= min_seconds and i + 1 >= min_collects:
            break
    return total_steps / total_seconds if total_seconds > 0 else throughput_of(rollout, wall, steps)


SAMPLE_TARGET_CV = 0.08
"""The spread (coefficient of variation) one offline sample should have at most, from which
:func:`collects_per_sample` sizes it. The heavy-tailed bench env (2% of steps 50x longer,
in lockstep across its envs) varied 25-35% from one 50 ms sample to the next, so the median
of the 3 samples behind a printed ratio moved it by 15-40% between runs; a sample of enough
collects to hold several slow steps varies ~8% and its median is its mean (a skewed
sample distribution's median is not: 7% above the long-run rate with one-collect samples)."""


def collects_per_sample(collect_rates: Sequence[float], target_cv: float = SAMPLE_TARGET_CV) -> int:
    """How many back-to-back collects one sample needs so that its steps/s varies about
    ``target_cv`` from sample to sample: ``ceil((cv / target_cv) ** 2)`` from the spread
    ``cv`` of single collects (the variance of a mean of ``m`` falls as ``1/m``; the
    collects of heavy-tailed envs are close to independent at these lengths), between 1
    and :data:`MAX_COLLECTS_PER_SAMPLE`; 1 with fewer than 3 collects seen. The spread is
    taken on per-step times (``1/rate``), the quantity a sample sums.

    Example:
        >>> collects_per_sample([1000.0, 1010.0, 990.0])      # steady: single collects do
        1
        >>> collects_per_sample([1000.0, 400.0, 1100.0, 950.0, 500.0])  # rare slow collects
        36
    """
    times = [1.0 / r for r in collect_rates if r > 0 and math.isfinite(r)]
    if len(times) < MIN_INTERVAL_SAMPLES:
        return 1
    cv = statistics.stdev(times) / statistics.fmean(times)
    return max(1, min(MAX_COLLECTS_PER_SAMPLE, math.ceil((cv / target_cv) ** 2)))


def throughput_of(rollout: Any, seconds: float, steps: int) -> float:
    """Steps/s of one collect: the executor's own stats when present, else our clock."""
    stats = getattr(rollout, "stats", None)
    if stats is not None:
        return float(stats.steps_per_second)
    return steps / seconds if seconds > 0 else math.inf


class TrialRecorder:
    """Feeds one trial sample by sample and applies the stopping rule. The offline
    :func:`measure` and the online tuner (one sample per training collect) both use it.

    ``warmup`` is how many of the first samples to discard (0 when the executor was already
    running this config, so nothing needs warming). ``reference`` (steps/s, typically the
    lower end of the best config's interval) ends the trial early, as ``"slower"``, once
    its whole interval lies below it: a config that cannot be chosen needs no precise mean."""

    def __init__(self, trial: Trial, protocol: MeasureProtocol, warmup: int | None = None,
                 clock: Callable[[], float] = time.perf_counter, deadline: float | None = None,
                 t0: float | None = None, reference: float | None = None):
        self.trial, self.protocol, self.clock, self.deadline = trial, protocol, clock, deadline
        self.reference = reference
        self.warmup_left = protocol.warmup_collects if warmup is None else warmup
        self.t0 = clock() if t0 is None else t0  # when its collects began (after any reconfigure)

    def add(self, steps_per_second: float) -> bool:
        """Record one collect's throughput; returns True when the trial is done."""
        tr = self.trial
        if self.warmup_left > 0:
            self.warmup_left -= 1
            tr.warmup.append(float(steps_per_second))
        else:
            tr.samples.append(float(steps_per_second))
        tr.seconds = self.clock() - self.t0 + tr.reconfigure_seconds
        reason = self.stop_reason()
        if reason:
            self.finish(reason)
            return True
        return False

    def stop_reason(self) -> str:
        """Why the trial should stop now, or ``""``."""
        tr, p = self.trial, self.protocol
        n = tr.n
        m, lo, hi, _ = tr.stats
        if n >= p.min_samples and hi - m <= p.rel_half_width * m and m - lo <= p.rel_half_width * m:
            return "converged"
        if self.reference is not None and hi < self.reference:
            return "slower"  # clearly slower than a config already measured: no need to pin it down
        if n >= p.max_samples:
            return "max_samples"
        if n >= 1 and p.max_seconds is not None and self.clock() - self.t0 >= p.max_seconds:
            return "max_seconds"
        if n >= 1 and self.deadline is not None and self.clock() >= self.deadline:
            return "budget"
        return ""

    def finish(self, reason: str) -> Trial:
        self.trial.stop_reason = reason
        if self.trial.status == "running":
            self.trial.status = "ok" if self.trial.samples else "failed"
        return self.trial


def measure(executor: Any, config: Config, num_steps: int, protocol: MeasureProtocol | None = None, *,
            source: str = "", deadline: float | None = None, clock: Callable[[], float] = time.perf_counter,
            on_sample: Callable[[Trial, float], None] | None = None, raise_errors: bool = True,
            reference: float | None = None, trial: Trial | None = None) -> Trial:
    """Run the protocol for one config on ``executor``; returns the :class:`Trial`.

    A config the executor refuses (:class:`auturi.ConfigError`) gives an ``"invalid"`` trial
    (the executor is unchanged). Any other error gives a ``"failed"`` trial and, with
    ``raise_errors`` (the default), is re-raised; the executor closes itself on such errors.
    ``deadline`` (a ``clock()`` value) stops sampling early, after at least one sample;
    ``reference`` stops it once the config is clearly slower (see :class:`TrialRecorder`).
    ``trial``, if given, is the (empty) Trial to fill, so a progress display can watch it.

    Example:
        >>> import gymnasium as gym, auturi
        >>> from auturi.envs import CountingEnv
        >>> ex = auturi.make_executor(CountingEnv, auturi.RandomPolicy(gym.spaces.Discrete(3)), 4, backend="serial")
        >>> t = measure(ex, auturi.Config(num_actors=2, envs_per_actor=2), 8)
        >>> t.status, len(t.warmup), t.n >= 3
        ('ok', 1, True)
        >>> ex.close()
    """
    p = protocol or MeasureProtocol()
    if trial is None:
        trial = Trial(config=config, source=source)
    t0 = clock()
    try:
        trial.reconfigure_seconds = float(executor.reconfigure(config) or 0.0)
    except ConfigError as e:
        trial.status, trial.error, trial.exception = "invalid", str(e), e
        trial.seconds = clock() - t0
        return trial
    except Exception as e:
        trial.status, trial.error, trial.exception = "failed", f"{type(e).__name__}: {e}", e
        trial.seconds = clock() - t0
        if raise_errors:
            raise
        return trial
    # The time cap counts from here: reconfigure time is reported apart, and starting
    # many processes can take longer than the cap itself.
    rec = TrialRecorder(trial, p, clock=clock, deadline=deadline, reference=reference)
    try:
        while True:
            measured = rec.warmup_left == 0
            sps = sample_throughput(executor, num_steps, num_steps * config.num_envs,
                                    p.min_sample_seconds if measured else 0.0, clock,
                                    collect_rates=trial.collect_rates if measured else None)
            was_warmup = rec.warmup_left > 0
            done = rec.add(sps)
            if on_sample is not None and not was_warmup:
                on_sample(trial, sps)
            if done:
                return trial
    except Exception as e:
        trial.status, trial.error, trial.exception = "failed", f"{type(e).__name__}: {e}", e
        trial.stop_reason = "error"
        trial.seconds = clock() - t0
        if raise_errors:
            raise
        return trial


def remeasure_interleaved(executor: Any, configs: Sequence[Config], num_steps: int,
                          protocol: MeasureProtocol | None = None, *, min_rounds: int = 2, max_rounds: int = 3,
                          samples_per_round: int = 1, clock: Callable[[], float] = time.perf_counter,
                          deadline: float | None = None, source: str = "final",
                          on_sample: Callable[[Trial, float], None] | None = None,
                          min_collects: dict[Config, int] | None = None, resize: bool = False,
                          max_collects: dict[Config, int] | None = None,
                          stop_when_separated: bool = True, budget_min_samples: int = 2) -> list[Trial]:
    """Re-measure ``configs`` in rounds (reconfigure, warm-up, ``samples_per_round``
    measured samples each visit) so slow drifts of the machine hit all of them alike.

    Rounds alternate direction (a b c, c b a, ...): a linear drift then hits every config
    alike, and the config ending one round starts the next without a reconfigure or a
    warm-up. Stops after ``min_rounds`` once every interval is within the protocol's fraction
    (``converged``) or, with ``stop_when_separated``, the fastest one's interval lies above
    all the others' (``separated``), or after ``max_rounds`` (``max_rounds``), or once each
    has ``budget_min_samples`` samples and another round as long as the last would end past
    ``deadline`` (``budget``). A sample of config ``c`` is at least ``min_collects[c]``
    collects (default 1) and the protocol's ``min_sample_seconds``; with ``resize``, before
    each sample, more when the collects seen so far in these rounds call for more
    (:func:`collects_per_sample`: a rare slow collect may show only here), up to
    ``max_collects[c]`` (default :data:`MAX_COLLECTS_PER_SAMPLE`).
    Returns one trial per config (source ``source``), in the given order.
    """
    p = protocol or MeasureProtocol()
    trials = [Trial(config=c, source=source, collects_per_sample=(min_collects or {}).get(c, 1)) for c in configs]
    last: Trial | None = None
    reason = "max_rounds"
    for r in range(max_rounds):
        r0 = clock()
        for tr in (trials if r % 2 == 0 else trials[::-1]):
            _visit(executor, tr, num_steps, p.warmup_collects if tr is not last else 0, samples_per_round,
                   clock, on_sample, p.min_sample_seconds,
                   (max_collects or {}).get(tr.config, MAX_COLLECTS_PER_SAMPLE) if resize else 0)
            last = tr
        live = [t for t in trials if t.status != "invalid"]
        if r + 1 >= min_rounds and all(t.half_width <= p.rel_half_width * t.estimate for t in live):
            reason = "converged"
            break
        if r + 1 >= min_rounds and stop_when_separated and _separated(live):
            reason = "separated"
            break
        # Stop when another round like this one would end past the deadline.
        now = clock()
        if deadline is not None and now + (now - r0) > deadline and \
                all(len(t.samples) >= budget_min_samples for t in live):
            reason = "budget"
            break
    for tr in trials:
        if resize:
            regroup(tr)
        if tr.status == "running":
            tr.status, tr.stop_reason = "ok", reason
    return trials


def regroup(trial: Trial) -> None:
    """When ``trial``'s sample length grew while it was measured (a slow collect showed
    late), its earlier, shorter samples would mostly have missed the slow collects and pull
    the median up: its collects, in the order taken, are regrouped into samples of the final
    length (each: their steps over their seconds; the last takes any leftover collects),
    shorter when that leaves fewer than 3 samples (an interval needs them)."""
    rates, sizes = trial.collect_rates, trial.sample_collects
    if not sizes or sum(sizes) != len(rates) or min(sizes) >= max(trial.collects_per_sample, max(sizes)):
        return  # nothing grew, or the collects do not add up to the samples (then leave them)
    m = max(1, min(max(trial.collects_per_sample, max(sizes)), len(rates) // MIN_INTERVAL_SAMPLES))
    k = max(1, len(rates) // m)
    bounds = [i * m for i in range(k)] + [len(rates)]
    groups = [rates[a:b] for a, b in zip(bounds, bounds[1:])]
    # One config's collects all take the same steps: a group's rate is their count over their summed 1/rate.
    trial.samples = [len(g) / sum(1.0 / r for r in g) for g in groups]
    trial.sample_collects = [len(g) for g in groups]


def _visit(executor: Any, tr: Trial, num_steps: int, warmup: int, samples: int, clock: Callable[[], float],
           on_sample: Callable[[Trial, float], None] | None, min_sample_seconds: float = 0.0,
           resize_up_to: int = 0) -> None:
    """One visit of the interleaved re-measure: reconfigure, warm up, measure (with
    ``resize_up_to`` > 0, each sample as long as the collects seen so far call for, up to
    that many collects)."""
    if tr.status == "invalid":
        return
    s0 = clock()
    steps = num_steps * tr.config.num_envs
    try:
        tr.reconfigure_seconds += float(executor.reconfigure(tr.config) or 0.0)
        for _ in range(warmup):
            c0 = clock()
            tr.warmup.append(throughput_of(executor.collect(num_steps), clock() - c0, steps))
        for _ in range(samples):
            before = len(tr.collect_rates)
            if resize_up_to > 0:
                wanted = max(tr.collects_per_sample, collects_per_sample(tr.collect_rates))
                tr.collects_per_sample = min(wanted, max(resize_up_to, tr.collects_per_sample))
            sps = sample_throughput(executor, num_steps, steps, min_sample_seconds, clock,
                                    min_collects=tr.collects_per_sample, collect_rates=tr.collect_rates)
            tr.samples.append(sps)
            tr.sample_collects.append(len(tr.collect_rates) - before)
            if on_sample is not None:
                on_sample(tr, sps)
    except ConfigError as e:
        tr.status, tr.error, tr.exception = "invalid", str(e), e
    except Exception as e:
        tr.status, tr.error, tr.exception = "failed", f"{type(e).__name__}: {e}", e
        raise
    finally:
        tr.seconds += clock() - s0


def _separated(trials: Sequence[Trial]) -> bool:
    """True when the fastest trial's interval lies entirely above every other's."""
    if len(trials) < 2:
        return True
    ranked = sorted(trials, key=lambda t: -t.estimate)
    top = ranked[0]
    return all(top.low > t.high for t in ranked[1:])
