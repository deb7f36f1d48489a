"""What the online tuner's samples say: collects added up into samples of a least length
(:class:`Span`: a trial's ``min_sample_seconds``, the monitor's ``monitor_seconds``), a trial
clearly slower than the best after one sample (:func:`clearly_slower`), and, once a config is
locked in, whether its throughput stayed more than ``drop_fraction`` below the locked figure
for ``drop_patience`` such samples in a row (:class:`DropMonitor`). What they start (the next
trial, a re-search around the locked config) is the phase machine's
(:class:`~auturi.tuner.OnlineTuner`).

Example (samples of at least a second; a drop is two samples in a row under half of 100 steps/s):
    >>> from auturi.tuner.online_settings import OnlineSettings
    >>> monitor = DropMonitor(OnlineSettings(monitor_seconds=1.0, drop_fraction=0.5, drop_patience=2))
    >>> monitor.watch(40.0, 20, reference=100.0)  # half a second: no sample yet
    >>> monitor.watch(40.0, 20, reference=100.0), monitor.drops  # one low sample
    (None, 1)
    >>> monitor.watch(40.0, 40, reference=100.0)  # the second in a row: the drop, at 40 steps/s
    40.0
"""
from __future__ import annotations

import math

from auturi.tuner.measure import Trial
from auturi.tuner.online_settings import OnlineSettings


class Span:
    """The collects of the sample being gathered, as (seconds, steps)."""

    def __init__(self) -> None:
        self.seconds, self.steps = 0.0, 0

    def reset(self) -> None:
        """Drop the collects gathered so far (a new trial, a lock-in, a reconfigure's warm-up)."""
        self.seconds, self.steps = 0.0, 0

    def add(self, sps: float, steps: int, span: float) -> float | None:
        """Add one collect (``steps`` at ``sps``, finite and > 0); once the collects add up to
        ``span`` seconds, return their steps/s and start a new sample, else None."""
        secs, n = self.seconds + steps / sps, self.steps + steps
        if secs < span:
            self.seconds, self.steps = secs, n
            return None
        self.reset()
        return n / secs


def clearly_slower(trial: Trial, best: Trial | None, margin: float) -> bool:
    """A search trial whose every measured sample so far is more than ``margin``
    (``slower_margin``) below the ``best`` measured figure: the sequential early stop (one
    sample suffices). Also the serial baseline after another start layout (a
    ``SubprocVecEnv`` user's, RLlib's): measured for the model's profile and as the fallback,
    it cannot be the choice once clearly slower than the start; two more samples of it cost an
    8,000-step DQN run on a 1 ms env ~0.1 s of its 2.2 s."""
    if trial.source not in ("online", "serial") or not trial.samples:
        return False
    return best is not None and max(trial.samples) < (1 - margin) * best.estimate


class DropMonitor:
    """Watches the locked-in config's collects under ``settings`` (``monitor_seconds``,
    ``drop_fraction``, ``drop_patience``); ``drops``: low samples in a row so far. ``fresh``:
    the next collect follows the lock-in's reconfigure, a warm-up, not a drop."""

    def __init__(self, settings: OnlineSettings):
        self.settings = settings
        self.drops = 0
        self.fresh = False
        self._span = Span()

    def arm(self) -> None:
        """Count from zero (a lock-in)."""
        self.drops = 0
        self._span.reset()

    def watch(self, sps: float, steps: int, reference: float) -> float | None:
        """Feed one collect (``steps`` at ``sps``) of the config locked in at ``reference``
        steps/s; returns the sample that made ``drop_patience`` low ones in a row, else None."""
        if self.fresh:  # right after the lock-in reconfigure: a warm-up, not a drop
            self.fresh = False
            self._span.reset()
            return None
        if not (sps > 0 and math.isfinite(sps)):
            return None
        sample = self._span.add(sps, steps, self.settings.monitor_seconds)
        if sample is None:
            return None
        s = self.settings
        self.drops = self.drops + 1 if sample < (1 - s.drop_fraction) * reference else 0
        return sample if self.drops >= s.drop_patience else None
