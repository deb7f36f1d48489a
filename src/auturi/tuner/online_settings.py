"""The online tuner's settings (:class:`OnlineSettings`): when it measures, moves, locks in
and re-searches, declared once, with each default and why, and validated on construction.

Every face takes them the same way: ``OnlineTuner(executor, settings=...)`` (or the same
names as keyword arguments), ``auturi.wrap(..., tuner_options=OnlineSettings(...))`` or the
old dict of the same names (checked here: a misspelt name is an error naming the closest).

Example:
    >>> s = OnlineSettings(budget_trials=4, search_share=0.1)
    >>> s.budget_trials, s.drop_patience
    (4, 3)
    >>> OnlineSettings(serch_share=0.1)
    Traceback (most recent call last):
    ...
    TypeError: OnlineSettings has no setting 'serch_share'; did you mean 'search_share'?
    >>> OnlineSettings(drop_fraction=1.5)
    Traceback (most recent call last):
    ...
    ValueError: OnlineSettings.drop_fraction must be in (0, 1), got 1.5
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from auturi.tuner.measure import MeasureProtocol

TUNER_ARGUMENTS = ("strategy", "space", "devices", "cores", "cache", "callback", "seed", "strategy_kwargs",
                   "workload", "clock")
"""The :class:`~auturi.tuner.OnlineTuner` arguments that are not settings: what it runs with
(its space, cache, events, clock), not when it moves. A face's option dict may hold them too."""


@dataclass(frozen=True, init=False)
class OnlineSettings:
    """The online tuner's thresholds (see :class:`~auturi.tuner.OnlineTuner` for the phases
    they steer). Frozen: :meth:`replace` makes a changed, re-validated copy."""

    # -- the budget
    budget_trials: int | None = 6
    """Configs the search measures, baselines included (None: ``budget_seconds`` alone, or
    the strategy's own stop): a few, because every trial runs the training off its best layout."""
    budget_seconds: float | None = None
    """Wall seconds from the first collect (training included) after which no trial starts
    (None: no limit)."""
    search_share: float | None = 0.05
    """The most of the wall time the search may cost (reconfigures and trial collects' time
    beyond the best config's rate) when the run's length is unknown; past it the tuner pauses
    on the best config (None: no limit). So a short run loses at most a few percent."""
    # -- one trial's measurement
    rel_half_width: float = 0.05
    """A trial stops once its median's interval is within this fraction (the protocol's rule)."""
    min_samples: int = 3
    """Samples before a trial may stop (an interval needs 3)."""
    max_samples: int = 5
    """Samples at most per trial: each one is training at a layout that may be slow."""
    warmup_collects: int = 1
    """Collects after a reconfigure that are used for training but not measured (page faults,
    first wake-ups)."""
    min_sample_seconds: float = 0.05
    """A sample spans consecutive collects until they add up to this long: an off-policy collect
    of one step per env takes a millisecond, and one alone measures the timer, not the layout."""
    self_warming_seconds: float | None = 1.0
    """A trial's collects at least this long are measured from the first (None: always a
    warm-up): what a reconfigure leaves to warm up is milliseconds, within such a collect's
    noise, and discarding one cost a PPO run of 8 long collects an eighth of its training."""
    slower_margin: float = 0.1
    """A search trial stops after its first samples when all are more than this fraction below
    the best measured figure (a sequential early stop: one sample suffices)."""
    # -- which moves are tried
    profile_from_rollouts: bool = True
    """The model's profile comes from the start layout's collects when that layout runs in the
    caller (False: profile the executor, as offline, at the cost of its own steps)."""
    min_gain: float = 0.05
    """A config is tried only where its prediction beats the best measured by this fraction:
    a smaller gain is within what a few samples' noise hides."""
    explore_factor: float = 2.0
    """With a known horizon, a layout family nothing was measured in is tried when, at the
    model's prediction raised by its error, the trial pays back this many times over (a
    gamble only a long run can afford; the model is most often wrong about whole families)."""
    warm_ahead_seconds: float | None = 0.5
    """Once collects the caller said not to measure (an off-policy warm-up) have lasted this
    long, the env workers' server starts during them (None: never ahead): its imports then
    overlap collects nobody times instead of delaying the first trial of env workers."""
    early_env_share: float | None = 0.5
    """After the first collect, when the envs took at least this share of it and the machine
    has room for env workers (8+ cores, or the collect used at most half a core of the caller:
    a simulator's envs, a GPU policy), the env workers' server starts at once, so their first
    trial does not wait for it (None: never this early; see ``OnlineTuner._first_look``)."""
    decisive_gain: float | None = 2.0
    """The start trial ends at its first measured sample when the model, profiled from it,
    predicts a layout this many times faster (None: the start is always measured fully). A
    gap this wide is far beyond the model's usual error (within 1.5x on the 2-core benches)
    and a few samples' noise; on a 16-core GPU box serial ran at a fifth of the best."""
    # -- the lock-in and after
    lock_margin: float = 0.03
    """The lock-in stays on the start layout unless another measured at least this fraction
    faster: the fastest of configs within noise of each other is fast partly by luck."""
    confirm_tolerance: float = 0.10
    """A cached choice is confirmed (and locked in without a search) when it measures within
    this fraction of its cached throughput."""
    drop_fraction: float = 0.15
    """Once locked in, a monitor sample this fraction below the locked figure counts as a drop."""
    drop_patience: int = 3
    """Drops in a row that start a re-search around the locked config."""
    monitor_seconds: float = 0.5
    """The drop monitor's samples span consecutive collects of at least this long: a cheap
    env's 30 ms collects dip by 15% often enough, by noise alone, to start re-searches."""
    max_research_trials: int = 6
    """Configs a re-search measures, the locked one included."""

    def __init__(self, **settings: Any):
        # A hand-written __init__ only to name the closest setting for a misspelt one (the
        # generated one says "unexpected keyword argument"); the fields stay the declaration.
        for name in settings:
            if name not in _FIELDS:
                raise TypeError(f"OnlineSettings has no setting {name!r}{_closest(name, _FIELDS)}")
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, settings.get(f.name, f.default))
        self.__post_init__()

    def __post_init__(self) -> None:
        _optional(self, "budget_trials", lambda v: _int(v) and v >= 1, "an integer >= 1 or None")
        _optional(self, "budget_seconds", lambda v: _num(v) and v > 0, "a number of seconds > 0 or None")
        _optional(self, "search_share", lambda v: _num(v) and 0 < v <= 1, "in (0, 1] or None")
        for name, ok, rule in (
                ("min_sample_seconds", lambda v: _num(v) and v >= 0, ">= 0"),
                ("slower_margin", lambda v: _num(v) and 0 <= v < 1, "in [0, 1)"),
                ("min_gain", lambda v: _num(v) and 0 <= v < 1, "in [0, 1)"),
                ("explore_factor", lambda v: _num(v) and v >= 1, ">= 1"),
                ("lock_margin", lambda v: _num(v) and 0 <= v < 1, "in [0, 1)"),
                ("confirm_tolerance", lambda v: _num(v) and 0 <= v < 1, "in [0, 1)"),
                ("drop_fraction", lambda v: _num(v) and 0 < v < 1, "in (0, 1)"),
                ("drop_patience", lambda v: _int(v) and v >= 1, "an integer >= 1"),
                ("monitor_seconds", lambda v: _num(v) and v >= 0, ">= 0"),
                ("max_research_trials", lambda v: _int(v) and v >= 1, "an integer >= 1"),
                ("profile_from_rollouts", lambda v: isinstance(v, bool), "True or False")):
            _check(self, name, ok, rule)
        _optional(self, "self_warming_seconds", lambda v: _num(v) and v > 0, "a number of seconds > 0 or None")
        _optional(self, "warm_ahead_seconds", lambda v: _num(v) and v >= 0, "a number of seconds >= 0 or None")
        _optional(self, "early_env_share", lambda v: _num(v) and 0 < v <= 1, "in (0, 1] or None")
        _optional(self, "decisive_gain", lambda v: _num(v) and v > 1, "a number > 1 or None")
        try:  # the protocol's own rules (rel_half_width, min/max_samples, warmup_collects)
            self.protocol()
        except ValueError as e:
            raise ValueError(f"OnlineSettings.{e}") from None

    def protocol(self) -> MeasureProtocol:
        """The measurement protocol of one trial (online, a trial has no wall-time cap: the
        training decides how long its collects take)."""
        return MeasureProtocol(rel_half_width=self.rel_half_width, min_samples=self.min_samples,
                               max_samples=self.max_samples, max_seconds=None, warmup_collects=self.warmup_collects)

    def replace(self, **changes: Any) -> OnlineSettings:
        """A copy with ``changes`` (validated; a misspelt name is a ``TypeError`` naming the closest)."""
        return OnlineSettings(**{**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """Every setting by name (the keyword arguments that rebuild these settings)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The settings' names, in declaration order."""
        return _FIELDS

    @classmethod
    def split(cls, options: Mapping[str, Any], where: str = "tuner_options") -> tuple[OnlineSettings, dict[str, Any]]:
        """A face's option dict as validated settings and the other :class:`OnlineTuner`
        arguments (:data:`TUNER_ARGUMENTS`: cache, space, callback, ...); any other key is a
        ``TypeError`` naming ``where`` and the closest known name.

        >>> s, rest = OnlineSettings.split({"search_share": 0.1, "cache": False})
        >>> s.search_share, rest
        (0.1, {'cache': False})
        """
        known = _FIELDS + TUNER_ARGUMENTS
        for name in options:
            if name not in known:
                raise TypeError(f"{where}: {name!r} is neither an OnlineSettings field nor an OnlineTuner argument"
                                f"{_closest(name, known)}")
        settings = cls(**{k: v for k, v in options.items() if k in _FIELDS})
        return settings, {k: v for k, v in options.items() if k not in _FIELDS}


_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(OnlineSettings))


def _closest(name: str, known: Iterable[str]) -> str:
    near = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.6)
    return f"; did you mean {near[0]!r}?" if near else f"; known: {', '.join(known)}"


def _num(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and not math.isnan(v)


def _int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check(s: OnlineSettings, name: str, ok: Any, rule: str) -> None:
    value = getattr(s, name)
    if not ok(value):
        raise ValueError(f"OnlineSettings.{name} must be {rule}, got {value!r}")


def _optional(s: OnlineSettings, name: str, ok: Any, rule: str) -> None:
    if getattr(s, name) is not None:
        _check(s, name, ok, rule)
