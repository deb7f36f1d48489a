"""The measurement protocol every strategy shares, and the :class:`Trial` it produces.

One trial of a config:

1. ``executor.reconfigure(config)``, timed and reported apart from throughput;
2. one warm-up collect (``warmup_collects``), discarded: it pays for first-touch page faults,
   lazily built models and caches, and would bias the mean;
3. measured collects until the 95% confidence half-width of the mean throughput is at most
   ``rel_half_width`` of the mean (after ``min_samples``), or a cap is hit
   (``max_samples``, ``max_seconds``, or the tuner's deadline).

Throughput is env steps per wall second of one collect (``rollout.stats.steps_per_second``).
Every sample is kept, so a results file can be re-analysed.

Example:
    >>> from auturi.tuner.measure import mean_half_width
    >>> m, hw = mean_half_width([100.0, 102.0, 98.0])
    >>> round(m, 1), round(hw, 2)
    (100.0, 4.97)
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

# Two-sided 95% quantiles of Student's t by degrees of freedom (scipy is not a dependency).
_T95 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
    11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
    20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
    29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980,
}
_Z95 = statistics.NormalDist().inv_cdf(0.975)


def t95(df: int) -> float:
    """Two-sided 95% quantile of Student's t with ``df`` degrees of freedom (``df >= 1``).

    Exact table values to 30, then interpolated in ``1/df`` (towards the normal quantile
    past 120)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df in _T95:
        return _T95[df]
    if df > 120:  # t approaches the normal quantile linearly in 1/df
        return _Z95 + (_T95[120] - _Z95) * 120 / df
    keys = sorted(_T95)
    lo = max(k for k in keys if k < df)
    hi = min(k for k in keys if k > df)
    w = (1 / lo - 1 / df) / (1 / lo - 1 / hi)
    return _T95[lo] + w * (_T95[hi] - _T95[lo])


def mean_half_width(samples: Sequence[float]) -> tuple[float, float]:
    """Mean and 95% confidence half-width (``t * s / sqrt(n)``); half-width is ``inf``
    below two samples, the mean ``nan`` with none."""
    n = len(samples)
    if n == 0:
        return math.nan, math.inf
    m = statistics.fmean(samples)
    if n == 1:
        return m, math.inf
    return m, t95(n - 1) * statistics.stdev(samples) / math.sqrt(n)


@dataclass
class MeasureProtocol:
    """When to stop measuring one config."""

    rel_half_width: float = 0.05
    """Stop once the 95% half-width is at most this fraction of the mean."""
    min_samples: int = 3
    """Measured collects before the rule may stop (at least 2: one sample has no spread)."""
    max_samples: int = 10
    """Cap on measured collects."""
    max_seconds: float | None = 20.0
    """Cap on one trial's wall seconds of collects, warm-up included, reconfigure not (None:
    no cap). At least one measured collect is always taken."""
    warmup_collects: int = 1
    """Collects after a reconfigure whose throughput is discarded."""

    def __post_init__(self) -> None:
        if not 0 < self.rel_half_width < 1:
            raise ValueError(f"rel_half_width must be in (0, 1), got {self.rel_half_width}")
        if self.min_samples < 2:
            raise ValueError(f"min_samples must be >= 2 (a confidence interval needs two samples), "
                             f"got {self.min_samples}")
        if self.max_samples < self.min_samples:
            raise ValueError(f"max_samples ({self.max_samples}) must be >= min_samples ({self.min_samples})")
        if self.warmup_collects < 0:
            raise ValueError(f"warmup_collects must be >= 0, got {self.warmup_collects}")

    def to_dict(self) -> dict[str, Any]:
        return {"rel_half_width": self.rel_half_width, "min_samples": self.min_samples,
                "max_samples": self.max_samples, "max_seconds": self.max_seconds,
                "warmup_collects": self.warmup_collects}


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
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def mean(self) -> float:
        """Mean throughput (steps/s); ``nan`` without samples."""
        return mean_half_width(self.samples)[0]

    @property
    def half_width(self) -> float:
        """95% confidence half-width of the mean (steps/s); ``inf`` below two samples."""
        return mean_half_width(self.samples)[1]

    @property
    def rel_half_width(self) -> float:
        m, hw = mean_half_width(self.samples)
        return hw / m if m and math.isfinite(m) else math.inf

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.samples)

    def score(self) -> float:
        """The mean for ranking; ``-inf`` for a trial that cannot be chosen."""
        return self.mean if self.ok else -math.inf

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(), "source": self.source, "status": self.status,
            "stop_reason": self.stop_reason, "error": self.error, "mean": _num(self.mean),
            "half_width": _num(self.half_width), "n": self.n, "samples": list(self.samples),
            "warmup": list(self.warmup), "reconfigure_seconds": self.reconfigure_seconds,
            "predicted": _num(self.predicted), "started": self.started, "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trial:
        return cls(config=Config.from_dict(d["config"]), samples=list(d.get("samples", [])),
                   warmup=list(d.get("warmup", [])), reconfigure_seconds=d.get("reconfigure_seconds", 0.0),
                   status=d.get("status", "ok"), stop_reason=d.get("stop_reason", ""), error=d.get("error"),
                   source=d.get("source", ""), predicted=d.get("predicted"), started=d.get("started", 0.0),
                   seconds=d.get("seconds", 0.0))

    def __str__(self) -> str:
        if not self.ok:
            return f"{self.config}: {self.status} {self.error or ''}".rstrip()
        hw = f"{self.half_width:,.0f}" if math.isfinite(self.half_width) else "?"
        return f"{self.config}: {self.mean:,.0f} +- {hw} steps/s (n={self.n}, {self.source})"


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
        if n >= p.min_samples and tr.half_width <= p.rel_half_width * tr.mean:
            return "converged"
        if self.reference is not None and n >= 2 and tr.mean + tr.half_width < self.reference:
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
            c0 = clock()
            rollout = executor.collect(num_steps)
            sps = throughput_of(rollout, clock() - c0, num_steps * config.num_envs)
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
                          deadline: float | None = None,
                          on_sample: Callable[[Trial, float], None] | None = None) -> list[Trial]:
    """Re-measure ``configs`` round robin (reconfigure, warm-up, ``samples_per_round``
    measured collects each visit) so slow drifts of the machine hit all of them alike.

    Stops after ``min_rounds`` once every trial's half-width is within the protocol's
    fraction or the fastest one's interval lies above all the others' (the choice is
    settled), or after ``max_rounds``, or once each has two samples and another round as long
    as the last would end past ``deadline``.
    Returns one ``"final"`` trial per config, in the given order.
    """
    p = protocol or MeasureProtocol()
    trials = [Trial(config=c, source="final") for c in configs]
    single = len(configs) == 1
    for r in range(max_rounds):
        r0 = clock()
        for tr in trials:
            s0 = clock()
            try:
                tr.reconfigure_seconds += float(executor.reconfigure(tr.config) or 0.0)
                # A lone config stays configured: it only needs warming once.
                for _ in range(p.warmup_collects if (r == 0 or not single) else 0):
                    c0 = clock()
                    tr.warmup.append(throughput_of(executor.collect(num_steps), clock() - c0,
                                                   num_steps * tr.config.num_envs))
                for _ in range(samples_per_round):
                    c0 = clock()
                    sps = throughput_of(executor.collect(num_steps), clock() - c0, num_steps * tr.config.num_envs)
                    tr.samples.append(sps)
                    if on_sample is not None:
                        on_sample(tr, sps)
            except ConfigError as e:
                tr.status, tr.error, tr.exception = "invalid", str(e), e
            except Exception as e:
                tr.status, tr.error, tr.exception = "failed", f"{type(e).__name__}: {e}", e
                raise
            finally:
                tr.seconds += clock() - s0
        live = [t for t in trials if t.status != "invalid"]
        if r + 1 >= min_rounds and all(t.half_width <= p.rel_half_width * t.mean for t in live):
            reason = "converged"
            break
        if r + 1 >= min_rounds and _separated(live):
            reason = "separated"
            break
        # Stop when another round like this one would end past the deadline.
        now = clock()
        if deadline is not None and now + (now - r0) > deadline and all(len(t.samples) >= 2 for t in live):
            reason = "budget"
            break
    else:
        reason = "max_rounds"
    for tr in trials:
        if tr.status == "running":
            tr.status, tr.stop_reason = "ok", reason
    return trials


def _separated(trials: Sequence[Trial]) -> bool:
    """True when the fastest trial's interval lies entirely above every other's."""
    if len(trials) < 2:
        return True
    ranked = sorted(trials, key=lambda t: -t.mean)
    top = ranked[0]
    return all(top.mean - top.half_width > t.mean + t.half_width for t in ranked[1:])
