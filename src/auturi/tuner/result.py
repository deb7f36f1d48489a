"""The tuners' shared vocabulary: :class:`TuneResult` (what a tuning run found, and its JSON
record), :class:`TuneError` and :class:`TunerEvent` (one progress report)."""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from auturi._version import __version__
from auturi.config import Config
from auturi.errors import AuturiError
from auturi.tuner.cache import RECORD_SCHEMA, fingerprint_key, load_record, save_record
from auturi.tuner.measure import Trial, ratio

Callback = Callable[["TunerEvent"], None]


class TuneError(AuturiError):
    """Tuning stopped because a config failed to run (the executor has closed itself).
    ``trials`` holds every trial up to and including the failed one; ``env_fails``: the
    serial config failed, so no layout can be skipped around it (the env itself fails)."""

    def __init__(self, message: str, trials: list[Trial], env_fails: bool = False):
        super().__init__(message)
        self.trials = trials
        self.env_fails = env_fails


@dataclass
class TunerEvent:
    """One progress report. ``kind`` is one of ``phase`` (the phase changed),
    ``trial_start``, ``sample`` (``value`` is the sample in steps/s), ``trial_end``,
    ``choice`` (offline result), ``locked`` (online lock-in), ``drop`` (online: throughput
    fell), ``done``. ``status`` is a snapshot of :meth:`Tuner.status`; ``trial`` is the live
    trial object, which keeps changing after the event."""

    kind: str
    status: dict[str, Any]
    trial: Trial | None = None
    value: float | None = None
    message: str = ""


def _cfg(c: Config | None) -> dict[str, Any] | None:
    return c.to_dict() if c is not None else None


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if math.isfinite(x) else "?"


# ---------------------------------------------------------------------------- result
@dataclass
class TuneResult:
    """What an offline tuning run found. ``trials`` are the search trials in order
    (baselines first); ``final`` the re-measures after the search: the interleaved rounds
    that decided between close finalists (source ``final``), then the rounds taken after the
    choice was made, of the choice, the start and the serial configs (source ``confirm``).
    The printed throughput and speed-ups come from the ``confirm`` rounds, so the choice's
    figure is not the lucky draw that made it win, and every ratio compares numbers taken in
    the same rounds.

    ``startup_seconds``: from the process's start to the first measurement (imports, env
    and policy set-up, fingerprints), when the caller measured it (``auturi tune`` does);
    ``setup_seconds``: the part of it inside :meth:`Tuner.tune`.

    :func:`auturi.tune` and :meth:`Tuner.tune` return one; ``save`` and ``load`` keep it as
    JSON (the record ``auturi tune --out`` writes and ``auturi show`` prints):

    >>> import os, tempfile, auturi, gymnasium as gym
    >>> from auturi.envs import CountingEnv
    >>> result = auturi.tune(CountingEnv, policy=auturi.RandomPolicy(gym.spaces.Discrete(3)), num_envs=2,
    ...                      num_steps=4, budget_trials=1, max_trial_seconds=0.5, backend="serial", cache=False)
    >>> result.choice == result.start == auturi.Config.serial(2)   # one trial: the start, serial
    True
    >>> [t.source for t in result.trials], result.speedup("serial")
    (['start'], 1.0)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     saved = auturi.TuneResult.load(result.save(os.path.join(d, "tuned.json")))
    >>> saved.choice == result.choice, saved.num_steps
    (True, 4)
    """

    choice: Config
    reason: str
    trials: list[Trial]
    final: list[Trial]
    start: Config
    num_steps: int
    strategy: dict[str, Any] = field(default_factory=dict)
    space: dict[str, Any] = field(default_factory=dict)
    protocol: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    profile_seconds: float = 0.0
    cache_hit: bool = False
    mode: str = "offline"
    startup_seconds: float | None = None
    setup_seconds: float = 0.0
    online: dict[str, Any] = field(default_factory=dict)
    """Online runs only: what the search cost this training run (``first_run``: collects and
    estimated seconds spent off the choice, see :meth:`OnlineTuner.first_run_cost`), how the
    profile was taken, the reconfigures. Empty for an offline run."""

    def _trial_of(self, config: Config, pools: Sequence[list[Trial]] | None = None) -> Trial | None:
        confirm = [t for t in self.final if t.source == "confirm"]
        decide = [t for t in self.final if t.source != "confirm"]
        for pool in pools if pools is not None else (confirm, decide, self.trials[::-1]):
            for t in pool:
                if t.config == config and t.ok:
                    return t
        return None

    @property
    def choice_trial(self) -> Trial | None:
        """The measurement whose numbers are printed for the choice: its ``confirm`` rounds
        when there were any, else the re-measure or search trial it was chosen on."""
        return self._trial_of(self.choice)

    @property
    def throughput(self) -> float:
        t = self.choice_trial
        return t.estimate if t else math.nan

    def reference_trial(self, versus: str = "start") -> Trial | None:
        """The start's (``"start"``) or serial config's (``"serial"``) measurement that the
        speed-up compares with: from the same rounds as :attr:`choice_trial`."""
        ref = self.start if versus == "start" else Config.serial(self.start.num_envs)
        ct = self.choice_trial
        if ct is not None and ct.source in ("confirm", "final"):
            return self._trial_of(ref, [[t for t in self.final if t.source == ct.source]])
        return self._trial_of(ref)

    def speedup(self, versus: str = "start") -> float:
        """The choice's estimate over the start (``"start"``) or serial (``"serial"``) config's,
        both from the same rounds (``nan`` when the reference was not measured in them)."""
        return ratio(self.choice_trial, self.reference_trial(versus))

    def counts(self) -> dict[str, int | None]:
        """How many configs each stage measured (the table's title and the "why" line
        both print these): ``baselines`` (start, serial, a cached choice), ``searched``
        (the strategy's proposals), ``measured`` (both), ``decided`` (re-measured to choose
        between close finalists), ``confirmed`` (re-measured after the choice), ``space``."""
        baselines = sum(t.source in ("start", "serial", "cache") for t in self.trials)
        searched = len(self.trials) - baselines
        return {"baselines": baselines, "searched": searched, "measured": len(self.trials),
                "decided": sum(t.source == "final" for t in self.final),
                "confirmed": sum(t.source == "confirm" for t in self.final),
                "space": self.space.get("configs") if isinstance(self.space, dict) else None}

    def to_record(self) -> dict[str, Any]:
        """The JSON results record (see :mod:`auturi.tuner.cache`)."""
        ct = self.choice_trial

        def num(x: float | None) -> float | None:
            return float(x) if x is not None and math.isfinite(x) else None

        total = None if self.startup_seconds is None else self.startup_seconds + self.setup_seconds
        return {
            "schema": RECORD_SCHEMA, "auturi": __version__, "mode": self.mode,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "key": fingerprint_key(self.hardware, self.workload),
            "hardware": self.hardware, "workload": self.workload,
            "strategy": self.strategy, "space": self.space, "protocol": self.protocol, "budget": self.budget,
            "num_steps": self.num_steps, "start": self.start.to_dict(), "cache_hit": self.cache_hit,
            "seconds": self.seconds, "profile_seconds": self.profile_seconds,
            "startup": {"before_tune_seconds": num(self.startup_seconds), "tune_setup_seconds": self.setup_seconds,
                        "to_first_measurement_seconds": num(total)},
            "counts": self.counts(), **({"online": self.online} if self.online else {}),
            "trials": [t.to_dict() for t in self.trials], "final": [t.to_dict() for t in self.final],
            "choice": {"config": self.choice.to_dict(), "throughput": num(self.throughput),
                       "low": num(ct.low) if ct else None, "high": num(ct.high) if ct else None,
                       "confidence": num(ct.confidence) if ct else None, "n": ct.n if ct else 0,
                       "source": ct.source if ct else None,
                       "half_width": num(ct.half_width) if ct else None, "why": self.reason,
                       "speedup_vs_start": num(self.speedup("start")),
                       "speedup_vs_serial": num(self.speedup("serial"))},
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> TuneResult:
        startup = rec.get("startup") or {}
        return cls(choice=Config.from_dict(rec["choice"]["config"]), reason=rec["choice"].get("why", ""),
                   trials=[Trial.from_dict(t) for t in rec.get("trials", [])],
                   final=[Trial.from_dict(t) for t in rec.get("final", [])],
                   start=Config.from_dict(rec["start"]), num_steps=rec.get("num_steps", 0),
                   strategy=rec.get("strategy", {}), space=rec.get("space", {}), protocol=rec.get("protocol", {}),
                   budget=rec.get("budget", {}), hardware=rec.get("hardware", {}), workload=rec.get("workload", {}),
                   seconds=rec.get("seconds", 0.0), profile_seconds=rec.get("profile_seconds", 0.0),
                   cache_hit=rec.get("cache_hit", False), mode=rec.get("mode", "offline"),
                   startup_seconds=startup.get("before_tune_seconds"),
                   setup_seconds=startup.get("tune_setup_seconds") or 0.0, online=dict(rec.get("online") or {}))

    def save(self, path: str | Path) -> Path:
        """Write the JSON record to ``path``."""
        return save_record(self.to_record(), path)

    @classmethod
    def load(cls, path: str | Path) -> TuneResult:
        return cls.from_record(load_record(path))

    def rows(self) -> list[Trial]:
        """Every trial in the tables' order: the confirm rounds first (the numbers printed for
        the choice and its speed-ups, so the starred row is the top one), then the re-measure
        that chose, then the search; fastest first within each."""
        stage = {"confirm": 0, "final": 1}
        return sorted(self.trials + self.final, key=lambda t: (stage.get(t.source, 2), -t.score()))

    def table(self) -> str:
        """The trials as a plain-text table (:meth:`rows` order); ``*`` marks the row whose
        numbers are printed for the choice."""
        ct = self.choice_trial
        out = [f"{'steps/s':>12} {'interval':>24} {'n':>3} {'source':>7}  config"]
        for t in self.rows():
            if t.ok:
                star = " *" if t is ct else ""
                out.append(f"{_fmt(t.estimate):>12} {t.interval_text():>24} {t.n:>3} {t.source:>7}  {t.config}{star}")
            else:
                out.append(f"{t.status:>12} {'':>24} {t.n:>3} {t.source:>7}  {t.config}  {t.error or ''}")
        return "\n".join(out)
