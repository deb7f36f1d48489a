"""The tuners: :class:`Tuner` (offline: measure, choose, reconfigure) and
:class:`OnlineTuner` (inside training: every collect is a measurement).

Both follow the same rules:

- the user's starting config and the serial config are always measured, and the choice is
  never a config measured slower than them;
- a cached choice for the same hardware and workload is measured first;
- progress goes to an optional ``callback(event)`` (:class:`TunerEvent`), and ``status()``
  returns the current state as a plain dict, for a progress bar or a status endpoint.

Example (offline):
    >>> import gymnasium as gym, auturi
    >>> from auturi.envs import CountingEnv
    >>> from auturi.tuner import Tuner
    >>> ex = auturi.make_executor(CountingEnv, auturi.RandomPolicy(gym.spaces.Discrete(3)), 4, backend="serial")
    >>> result = Tuner(strategy="grid", budget_trials=3, cache=False).tune(ex, num_steps=8)
    >>> ex.config == result.choice
    True
    >>> ex.close()

Example (online, in a training loop)::

    online = OnlineTuner(executor, budget_trials=12)
    for update in range(1000):
        rollout = online.collect(128)   # always the real rollout; the tuner measures it
        learner.train(rollout)
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from auturi.config import Config
from auturi.errors import AuturiError, ConfigError
from auturi.tuner.cache import (
    RECORD_SCHEMA,
    ResultsCache,
    fingerprint_key,
    hardware_fingerprint,
    load_record,
    open_cache,
    record_choice,
    save_record,
    workload_fingerprint,
)
from auturi.tuner.measure import (
    MIN_INTERVAL_SAMPLES,
    MeasureProtocol,
    Trial,
    TrialRecorder,
    measure,
    ratio,
    remeasure_interleaved,
    throughput_of,
)
from auturi.tuner.space import SearchSpace, build_space
from auturi.tuner.strategies import Strategy, make_strategy

Callback = Callable[["TunerEvent"], None]


class TuneError(AuturiError):
    """Tuning stopped because a config failed to run (the executor has closed itself).
    ``trials`` holds every trial up to and including the failed one."""

    def __init__(self, message: str, trials: list[Trial]):
        super().__init__(message)
        self.trials = trials


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
    ``setup_seconds``: the part of it inside :meth:`Tuner.tune`."""

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
        from auturi import __version__

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
            "counts": self.counts(),
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
                   setup_seconds=startup.get("tune_setup_seconds") or 0.0)

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


# ---------------------------------------------------------------------------- shared state
class _Session:
    """What both tuners share: budget, history, events, status."""

    mode = "offline"

    def __init__(self, strategy: str | Strategy, *, budget_trials: int | None, budget_seconds: float | None,
                 protocol: MeasureProtocol, space: SearchSpace | None, devices: Sequence[str] | None,
                 cores: int | None, cache: Any, callback: Callback | None, seed: int,
                 strategy_kwargs: dict[str, Any] | None, workload: dict[str, Any] | None,
                 clock: Callable[[], float]):
        if budget_trials is not None and budget_trials < 1:
            raise ValueError(f"budget_trials must be >= 1 (or None), got {budget_trials}")
        if budget_seconds is not None and budget_seconds <= 0:
            raise ValueError(f"budget_seconds must be > 0 (or None), got {budget_seconds}")
        self.strategy = make_strategy(strategy, **(strategy_kwargs or {}))
        self.budget_trials = budget_trials
        if budget_trials is None and budget_seconds is None:
            self.budget_trials = self.strategy.default_budget_trials
        self.budget_seconds = budget_seconds
        self.protocol = protocol
        self.space = space
        self.devices, self.cores = devices, cores
        self.cache: ResultsCache | None = open_cache(cache)
        self.callback = callback
        self.seed = seed
        self.workload_extra = workload
        self.clock = clock
        self.phase = "idle"
        self.history: list[Trial] = []
        self.final: list[Trial] = []
        self.current: Trial | None = None
        self.t0: float | None = None
        self.hardware: dict[str, Any] = {}
        self.workload: dict[str, Any] = {}
        self.cached: tuple[Config, float | None] | None = None
        self.choice: Trial | None = None  # the measurement the final choice was made on
        self.profile_seconds = 0.0
        self._prepared = False

    # -- budget
    def elapsed(self) -> float:
        return 0.0 if self.t0 is None else self.clock() - self.t0

    search_budget_share = 1.0
    """The share of ``budget_seconds`` the search may use; the offline tuner keeps the rest for
    its final re-measure, so the whole of ``tune()`` fits the budget."""

    def deadline(self) -> float | None:
        """When the search must stop (trials stop sampling, no new trial starts)."""
        if self.budget_seconds is None or self.t0 is None:
            return None
        return self.t0 + self.budget_seconds * self.search_budget_share

    def trials_left(self) -> int | None:
        if self.budget_trials is None:
            return None
        return max(0, self.budget_trials - len(self.history))

    def seconds_left(self) -> float | None:
        if self.budget_seconds is None:
            return None
        return max(0.0, self.budget_seconds - self.elapsed())

    def budget_spent(self) -> bool:
        t, d = self.trials_left(), self.deadline()
        return (t is not None and t <= 0) or (d is not None and self.clock() >= d)

    # -- bookkeeping
    def best(self, trials: Sequence[Trial] | None = None) -> Trial | None:
        """The fastest successfully measured trial."""
        ok = [t for t in (self.history if trials is None else trials) if t.ok]
        return max(ok, key=lambda t: t.estimate) if ok else None

    def _setup(self, executor: Any, num_steps: int) -> None:
        if self.t0 is not None:
            raise AuturiError(f"this {type(self).__name__} has already run (its history and strategy state are "
                              f"spent); make a new one for another run")
        self.t0 = self.clock()
        n = int(executor.num_envs)
        if self.space is None:
            self.space = build_space(n, cores=self.cores, devices=self.devices)
        elif set(self.space.totals) != {n}:
            raise ValueError(f"the search space covers totals {list(self.space.totals)} but the executor has "
                             f"num_envs={n}; an executor's total is fixed: build the space with build_space({n})")
        self.hardware = hardware_fingerprint()
        self.workload = workload_fingerprint(executor, num_steps, self.workload_extra)
        if self.cache is not None:
            rec = self.cache.load(self.hardware, self.workload)
            self.cached = record_choice(rec) if rec else None
            if self.cached and self.cached[0].num_envs != n:
                self.cached = None

    def _prepare_strategy(self, executor: Any, num_steps: int) -> None:
        if self._prepared:
            return
        assert self.space is not None
        self._set_phase("profiling")
        p0 = self.clock()
        self.strategy.prepare(self.space, executor, num_steps, seed=self.seed)
        self.profile_seconds = self.clock() - p0
        self._prepared = True

    def _next_proposal(self) -> Config | None:
        """The strategy's next config not measured yet (a repeat is skipped, not re-run)."""
        tried = {t.config for t in self.history}
        for _ in range(1000):
            c = self.strategy.propose(self.history)
            if c is None or c not in tried:
                return c
        return None

    def _set_phase(self, phase: str) -> None:
        self.phase = phase
        self._emit("phase", message=phase)

    def _emit(self, kind: str, trial: Trial | None = None, value: float | None = None, message: str = "") -> None:
        if self.callback is not None:
            self.callback(TunerEvent(kind=kind, status=self.status(), trial=trial, value=value, message=message))

    def status(self) -> dict[str, Any]:
        """The current state as a plain, JSON-ready dict."""
        best = self.choice or self.best(self.final or None) or self.best()
        cur = self.current
        tl, sl = self.trials_left(), self.seconds_left()
        return {
            "mode": self.mode, "phase": self.phase, "strategy": self.strategy.name,
            "current_config": _cfg(cur.config) if cur else None,
            "current_samples": cur.n if cur else 0,
            "best_config": _cfg(best.config) if best else None,
            "best_throughput": best.estimate if best else None,
            "best_half_width": best.half_width if best and math.isfinite(best.half_width) else None,
            "best_low": best.low if best and math.isfinite(best.low) else None,
            "best_high": best.high if best and math.isfinite(best.high) else None,
            "best_confidence": best.confidence if best and math.isfinite(best.confidence) else None,
            "trials": len(self.history), "trials_ok": sum(t.ok for t in self.history),
            "budget_trials": self.budget_trials, "budget_trials_left": tl,
            "budget_seconds": self.budget_seconds, "budget_seconds_left": sl,
            "elapsed_seconds": self.elapsed(),
            "space": self.space.sizes() if self.space else None,
            "cache_hit": self.cached is not None,
        }

    def trials(self) -> list[dict[str, Any]]:
        """Every trial so far as a dict (samples included)."""
        return [t.to_dict() for t in self.history + self.final]

    def _reference(self, source: str) -> float | None:
        """Below this a search trial may stop early: the lower end of the best measured
        config's interval. Baselines are always measured fully: the choice is judged
        against them."""
        if source not in ("search", "online"):
            return None
        best = self.best()
        if best is None or not math.isfinite(best.low):
            return None
        return best.low

    def _record_trial(self, trial: Trial) -> None:
        trial.predicted = trial.predicted if trial.predicted is not None else self.strategy.predicted(trial.config)
        self.history.append(trial)


FINAL_SHARE = 0.3
"""The share of an offline tuner's ``budget_seconds`` kept for the final re-measure."""


# ---------------------------------------------------------------------------- offline
class Tuner(_Session):
    """Offline tuning: measure configs on an executor, choose, and leave it reconfigured.

    Args:
        strategy: ``"model"`` (default), ``"grid"``, ``"optuna"``, or a :class:`Strategy`.
        budget_trials: most configs measured in the search, baselines included (default:
            the strategy's own stopping rule; ``optuna`` uses 20). The final interleaved
            re-measure of the best few is not counted.
        budget_seconds: wall seconds for the whole of :meth:`tune`: the search (profiling
            included) gets ``1 - FINAL_SHARE`` of them, and its running trial stops sampling
            at that point once it has one sample; the final re-measure gets the rest, keeps
            only the finalists whose estimated round fits in it (none if not even the best
            one's does) and stops after a round once past the budget. Reconfigures and the
            first samples of the start and serial configs can still make a short budget
            overrun.
        rel_half_width, min_samples, max_samples, max_trial_seconds: the measurement
            protocol (:class:`MeasureProtocol`); or pass ``protocol``.
        top_k: before the choice, the configs whose confidence interval reaches the best
            one's (at most ``top_k`` of them, plus start and serial when among them) are
            re-measured round robin; the choice is the fastest of those measurements and of
            the start and serial configs' own. 0 turns this off.
        final_rounds: ``(min, max)`` rounds of that re-measure (it stops after ``min`` once
            every interval is within ``rel_half_width`` or the fastest is clearly ahead).
        final_samples: measured collects per finalist per round.
        confirm_rounds: after the choice is made, it is re-measured with the start and
            serial configs in this many interleaved rounds (fewer when the budget is short),
            at least 3 samples each; the printed throughput and speed-ups come from these
            rounds, so the choice's figure is not the draw that made it win, and each ratio
            compares numbers taken in the same rounds. Should the choice measure slower than
            start or serial there, the faster of those is the choice. 0 turns this off (the
            figures then come from the samples the choice was made on).
        space / devices / cores: the search space, or what to build it from.
        cache: None (default directory), False (no cache), a directory or a ResultsCache.
        confirm_tolerance: a cached choice is confirmed, and the search skipped, when it
            measures within this fraction of its cached throughput and beats start and serial.
        callback: called with a :class:`TunerEvent` on every step.
        seed: seeds the strategy.
        strategy_kwargs: passed to the strategy's constructor when ``strategy`` is a name.
        workload: extra fields for the workload fingerprint (e.g. ``{"name": "cartpole"}``).
    """

    mode = "offline"

    def __init__(self, strategy: str | Strategy = "model", *, budget_trials: int | None = None,
                 budget_seconds: float | None = None, rel_half_width: float = 0.05, min_samples: int = 3,
                 max_samples: int = 10, max_trial_seconds: float | None = 20.0,
                 protocol: MeasureProtocol | None = None, top_k: int = 3, final_rounds: tuple[int, int] = (2, 3),
                 final_samples: int = 2, confirm_rounds: int = 3,
                 space: SearchSpace | None = None, devices: Sequence[str] | None = None, cores: int | None = None,
                 cache: Any = None, confirm_tolerance: float = 0.10, callback: Callback | None = None,
                 seed: int = 0, strategy_kwargs: dict[str, Any] | None = None,
                 workload: dict[str, Any] | None = None, clock: Callable[[], float] = time.perf_counter):
        protocol = protocol or MeasureProtocol(rel_half_width=rel_half_width, min_samples=min_samples,
                                               max_samples=max_samples, max_seconds=max_trial_seconds)
        super().__init__(strategy, budget_trials=budget_trials, budget_seconds=budget_seconds, protocol=protocol,
                         space=space, devices=devices, cores=cores, cache=cache, callback=callback, seed=seed,
                         strategy_kwargs=strategy_kwargs, workload=workload, clock=clock)
        self.top_k = top_k
        self.final_rounds = final_rounds
        self.final_samples = final_samples
        if confirm_rounds < 0:
            raise ValueError(f"confirm_rounds must be >= 0 (0: off), got {confirm_rounds}")
        self.confirm_rounds = confirm_rounds
        self.setup_seconds = 0.0  # from tune() to its first measurement
        self.startup_seconds: float | None = None
        """Seconds the caller spent before :meth:`tune` (``auturi tune`` sets it: process start
        to the call); recorded apart from the tuning's own seconds."""
        if top_k > 0 and final_rounds[1] > 0:
            self.search_budget_share = 1.0 - FINAL_SHARE
        self.confirm_tolerance = confirm_tolerance

    def _measure(self, executor: Any, config: Config, num_steps: int, source: str) -> Trial:
        trial = Trial(config=config, source=source)
        if not self.history:
            self.setup_seconds = self.elapsed()
        self.current = trial
        self._emit("trial_start", trial, message=str(config))
        t = measure(executor, config, num_steps, self.protocol, source=source, deadline=self.deadline(),
                    clock=self.clock, raise_errors=False, reference=self._reference(source), trial=trial,
                    on_sample=lambda tr, v: self._emit("sample", tr, v))
        t.started = self.clock() - (self.t0 or 0.0) - t.seconds
        self.current = None
        self._record_trial(t)
        self._emit("trial_end", t, t.estimate if t.ok else None, str(t))
        if t.status == "failed":
            self.phase = "failed"
            raise TuneError(f"tuning stopped: {config} failed ({t.error}). The executor closed itself; make a "
                            f"new one. To skip such layouts, pass a space without them "
                            f"(build_space(...) and filter its configs).", list(self.history)) from t.exception
        return t

    def tune(self, executor: Any, num_steps: int) -> TuneResult:
        """Measure, choose, and reconfigure ``executor`` to the choice.

        ``num_steps`` is the rollout length of one collect (use the training's own).
        Raises :class:`TuneError` if a config fails (the executor has then closed itself).
        """
        self._setup(executor, num_steps)
        n = executor.num_envs
        start = executor.config
        serial = Config.serial(n)
        self._set_phase("baseline")
        # The cached choice first (a second run starts at the known best), then the two
        # configs the choice must never be slower than.
        baselines: list[Config] = [self.cached[0]] if self.cached else []
        for c in (start, serial):
            if c not in baselines:
                baselines.append(c)
        for c in baselines:
            src = "start" if c == start else ("cache" if self.cached and c == self.cached[0] else "serial")
            self._measure(executor, c, num_steps, src)

        confirmed = self._cache_confirmed(start, serial)
        if not confirmed:
            self._prepare_strategy(executor, num_steps)
            self._set_phase("search")
            while not self.budget_spent():
                c = self._next_proposal()
                if c is None:
                    break
                self._measure(executor, c, num_steps, "search")

        self._set_phase("final")
        contenders = self._finalists(start, serial)
        plan = self._confirm_plan([contenders[0], start, serial])
        decide = self._fit_budget(contenders, reserve=plan[2]) if self.top_k > 0 and self.final_rounds[1] > 0 else []
        candidate = self._decide(executor, decide, num_steps, plan[2]) if len(decide) > 1 else None
        if candidate is None:  # one contender, or no room to re-measure several: the search's best
            candidate = self.best([t for t in self.history if t.config == contenders[0]])
        assert candidate is not None
        choice_trial, note = candidate, ""
        if plan[0] > 0:
            confirm = self._remeasure(executor, list(dict.fromkeys([candidate.config, start, serial])), num_steps,
                                      rounds=plan[0], samples=plan[1], source="confirm", deadline=None)
            choice_trial, note = self._confirmed_choice(confirm, candidate.config, start, serial)
        choice = choice_trial.config
        self.choice = choice_trial
        executor.reconfigure(choice)
        result = TuneResult(
            choice=choice, reason="", trials=list(self.history), final=list(self.final), start=start,
            num_steps=num_steps, strategy=self.strategy.info(), space=self.space.sizes() if self.space else {},
            protocol=self.protocol.to_dict(),
            budget={"trials": self.budget_trials, "seconds": self.budget_seconds, "top_k": self.top_k,
                    "final_rounds": list(self.final_rounds), "final_samples": self.final_samples,
                    "confirm_rounds": plan[0], "confirm_samples_per_round": plan[1]},
            hardware=self.hardware, workload=self.workload, seconds=self.elapsed(),
            profile_seconds=self.profile_seconds, cache_hit=self.cached is not None,
            setup_seconds=self.setup_seconds, startup_seconds=self.startup_seconds)
        result.reason = self._reason(result, confirmed, note)
        if self.cache is not None:
            self.cache.store(result.to_record())
        self.phase = "done"
        self._emit("choice", choice_trial, choice_trial.estimate, result.reason)
        self._emit("done", message=result.reason)
        return result

    def _remeasure(self, executor: Any, configs: list[Config], num_steps: int, *, rounds: int | tuple[int, int],
                   samples: int, source: str, deadline: float | None) -> list[Trial]:
        """Interleaved rounds of ``configs`` (see :func:`remeasure_interleaved`), kept in ``final``."""
        lo, hi = (rounds, rounds) if isinstance(rounds, int) else rounds
        began = self.elapsed()
        try:
            trials = remeasure_interleaved(executor, configs, num_steps, self.protocol, min_rounds=lo, max_rounds=hi,
                                           samples_per_round=samples, clock=self.clock, deadline=deadline,
                                           source=source, on_sample=self._final_sample)
        except Exception as e:
            self.phase = "failed"
            where = self.current.config if self.current else "a finalist"
            raise TuneError(f"tuning stopped in the final re-measure: {where} failed ({type(e).__name__}: {e}). "
                            f"The executor closed itself; make a new one.", list(self.history)) from e
        self.current = None
        for t in trials:
            t.started = began
            if source == "confirm" and t.ok:
                t.stop_reason = "confirm"  # a fixed number of rounds, whatever the intervals did
        self.final += trials
        return trials

    def _decide(self, executor: Any, finalists: list[Config], num_steps: int, reserve: float) -> Trial | None:
        """Re-measure close finalists interleaved (a drift of the machine then hits them
        alike; a lucky first trial is unmasked) and return the fastest; None if none ran."""
        deadline = None if self.budget_seconds is None else (self.t0 or 0.0) + self.budget_seconds - reserve
        trials = self._remeasure(executor, finalists, num_steps, rounds=self.final_rounds,
                                 samples=self.final_samples, source="final", deadline=deadline)
        return self.best(trials)

    def _confirmed_choice(self, confirm: list[Trial], candidate: Config, start: Config,
                          serial: Config) -> tuple[Trial, str]:
        """The choice's trial in the rounds taken after it was chosen; if there it measured
        slower than the start or serial config, the faster of those instead (the choice is
        never a config measured slower than them), with a note saying so."""
        by = {t.config: t for t in confirm if t.ok}
        mine = by.get(candidate)
        refs = [by[c] for c in (start, serial) if c in by and c != candidate]
        best_ref = max(refs, key=lambda t: t.estimate, default=None)
        if mine is None and best_ref is None:
            raise TuneError("the final rounds measured none of the choice, start and serial configs",
                            list(self.history))
        if mine is None or (best_ref is not None and best_ref.estimate > mine.estimate):
            assert best_ref is not None
            which = "the start config" if best_ref.config == start else "serial"
            return best_ref, f"{candidate} measured slower than {which} after it was chosen, so {which} is the choice"
        return mine, ""

    def _final_sample(self, trial: Trial, value: float) -> None:
        self.current = trial
        self._emit("sample", trial, value)

    def _cache_confirmed(self, start: Config, serial: Config) -> bool:
        """A cached choice is confirmed when it measures close to its cached throughput and
        at least as fast as the start and serial configs."""
        if not self.cached:
            return False
        cfg, cached_sps = self.cached
        mine = [t for t in self.history if t.config == cfg and t.ok]
        if not mine:
            return False
        m = mine[-1].estimate
        base = max((t.estimate for t in self.history if t.ok and t.config in (start, serial)), default=0.0)
        close = cached_sps is None or m >= (1 - self.confirm_tolerance) * cached_sps
        return close and m >= base

    def _finalists(self, start: Config, serial: Config) -> list[Config]:
        """The configs still in contention: those whose confidence interval reaches the best
        one's; the ``top_k`` fastest of them, plus start, serial and the cached choice when
        they are in contention. (Re-measuring a clearly slower one would cost reconfigures,
        seconds each on a real machine, and tell nothing.)"""
        by_cfg: dict[Config, Trial] = {}
        for t in self.history:
            if t.ok and (t.config not in by_cfg or t.estimate > by_cfg[t.config].estimate):
                by_cfg[t.config] = t
        if not by_cfg:
            raise TuneError("no config could be measured (every trial was invalid); check the executor and the "
                            "search space", list(self.history))
        ranked = sorted(by_cfg.values(), key=lambda t: -t.estimate)
        top = ranked[0]
        floor = top.low
        contenders = [t.config for t in ranked if t.high >= floor]
        out = contenders[:max(1, self.top_k)]  # the top one at least: it is the candidate
        for c in [start, serial] + ([self.cached[0]] if self.cached else []):
            if c in contenders and c not in out:
                out.append(c)
        return out

    def _visit_cost(self, config: Config, samples: int) -> float:
        """Seconds one visit of the interleaved re-measure (reconfigure, warm-up, ``samples``
        collects) should take, from the config's search trial."""
        t = next((t for t in self.history if t.config == config and t.ok), None)
        if t is None:
            return 0.0
        collects = len(t.warmup) + len(t.samples)
        per_collect = max(0.0, t.seconds - t.reconfigure_seconds) / max(1, collects)
        return t.reconfigure_seconds + per_collect * (self.protocol.warmup_collects + samples)

    def _confirm_plan(self, configs: list[Config]) -> tuple[int, int, float]:
        """``(rounds, samples per round, estimated seconds)`` of the confirm rounds: at least
        3 samples each (an interval needs them), in as many interleaved rounds, up to
        ``confirm_rounds``, as what is left of ``budget_seconds`` allows (one round of 3
        samples when even two rounds do not fit: it is never skipped)."""
        if self.confirm_rounds <= 0:
            return 0, 0, 0.0
        configs = list(dict.fromkeys(configs))
        left = math.inf if self.budget_seconds is None or self.t0 is None else \
            self.t0 + self.budget_seconds - self.clock()
        for rounds in range(self.confirm_rounds, 0, -1):
            per = -(-MIN_INTERVAL_SAMPLES // rounds)
            cost = rounds * sum(self._visit_cost(c, per) for c in configs)
            if cost <= left or rounds == 1:
                return rounds, per, cost
        raise AssertionError("unreachable")

    def _fit_budget(self, finalists: list[Config], reserve: float = 0.0) -> list[Config]:
        """The finalists, in rank order, whose re-measure fits in what is left of
        ``budget_seconds`` after ``reserve`` (the confirm rounds), each costed from its search
        trial for the rounds that give it two samples. With no budget, all of them."""
        if self.budget_seconds is None or self.t0 is None:
            return finalists
        left = self.t0 + self.budget_seconds - self.clock() - reserve
        rounds = -(-2 // max(1, self.final_samples))
        out: list[Config] = []
        for c in finalists:
            left -= rounds * self._visit_cost(c, self.final_samples)
            if left < 0:
                break
            out.append(c)
        return out

    def _reason(self, result: TuneResult, confirmed: bool, note: str) -> str:
        """The "why" line: the counts of :meth:`TuneResult.counts` (the table's title prints
        the same) and the figures of the starred row."""
        k = result.counts()
        ct = result.choice_trial
        assert ct is not None
        parts = [f"{k['measured']} configs measured ({k['baselines']} baselines + {k['searched']} of "
                 f"{k['space'] if k['space'] is not None else '?'} searched, {self.strategy.name})"]
        if k["decided"]:
            parts.append(f"{k['decided']} close ones re-measured interleaved to choose")
        if ct.source == "confirm":
            parts.append(f"then the choice, start and serial re-measured in {result.budget.get('confirm_rounds')} "
                         f"interleaved rounds: {_fmt(ct.estimate)} steps/s (median of {ct.n})")
        else:
            parts.append(f"{_fmt(ct.estimate)} steps/s from the samples it was chosen on (not re-measured "
                         f"after: may be optimistic)")
        for name, versus in (("the start config", "start"), ("serial", "serial")):
            ref = result.reference_trial(versus)
            if ref is not None and ref.config == ct.config:
                parts.append(f"it is {name}")
            elif ref is not None:
                parts.append(f"{ratio(ct, ref):.2f}x {name} ({_fmt(ref.estimate)})")
        if note:
            parts.append(note)
        if confirmed:
            parts.append("the cached choice was confirmed, so the search was skipped")
        elif self.cached:
            parts.append("the cached choice was not confirmed, so the search ran")
        return "; ".join(parts)


# ---------------------------------------------------------------------------- online
class OnlineTuner(_Session):
    """Tunes inside training: each :meth:`collect` is one real collect that the learner
    gets back, and also one sample for the trial of the config it ran under.

    Phases: ``explore`` (baselines, then the strategy's proposals, one trial after
    another; a collect right after a reconfigure is a warm-up: its data is used, its
    throughput is not), ``locked`` (the budget is spent: the fastest measured config runs
    from then on), ``research`` (throughput stayed more than ``drop_fraction`` below the
    locked mean for ``drop_patience`` collects in a row: the locked config and its
    neighbours are re-measured and the fastest is locked in), ``paused`` (the search has
    cost more than ``search_share`` of the training's wall time so far: the fastest config
    measured so far runs until the share is back under the limit, then the search goes on).

    What the search costs: every reconfigure, plus, for each collect of a trial, the time it
    took beyond what the fastest config measured so far would have taken. With the share
    bounded, a short training run loses at most about ``search_share`` of its time to the
    search, and a long one finishes the search and keeps the gain.

    Args:
        executor: the training's executor; this object never collects more than asked.
        strategy, budget_trials, budget_seconds, space, devices, cores, cache, callback,
            seed, strategy_kwargs, workload: as for :class:`Tuner` (``budget_seconds`` counts
            wall time since the first collect, training time included).
        rel_half_width, min_samples, max_samples, warmup_collects: the protocol per trial.
        drop_fraction, drop_patience: what counts as a sustained drop.
        max_research_trials: configs a re-search measures (the locked one included).
        search_share: the most of the wall time since the first collect that the search may
            cost (None: no limit, the search runs its budget back to back).
    """

    mode = "online"

    def __init__(self, executor: Any, strategy: str | Strategy = "model", *, budget_trials: int | None = 12,
                 budget_seconds: float | None = None, rel_half_width: float = 0.05, min_samples: int = 3,
                 max_samples: int = 6, warmup_collects: int = 1, drop_fraction: float = 0.15,
                 drop_patience: int = 3, max_research_trials: int = 6, space: SearchSpace | None = None,
                 devices: Sequence[str] | None = None, cores: int | None = None, cache: Any = None,
                 callback: Callback | None = None, seed: int = 0, strategy_kwargs: dict[str, Any] | None = None,
                 workload: dict[str, Any] | None = None, clock: Callable[[], float] = time.perf_counter,
                 search_share: float | None = 0.1):
        if search_share is not None and not 0 < search_share <= 1:
            raise ValueError(f"search_share must be in (0, 1] or None, got {search_share}")
        if not 0 < drop_fraction < 1:
            raise ValueError(f"drop_fraction must be in (0, 1), got {drop_fraction}")
        if drop_patience < 1:
            raise ValueError(f"drop_patience must be >= 1, got {drop_patience}")
        protocol = MeasureProtocol(rel_half_width=rel_half_width, min_samples=min_samples, max_samples=max_samples,
                                   max_seconds=None, warmup_collects=warmup_collects)
        super().__init__(strategy, budget_trials=budget_trials, budget_seconds=budget_seconds, protocol=protocol,
                         space=space, devices=devices, cores=cores, cache=cache, callback=callback, seed=seed,
                         strategy_kwargs=strategy_kwargs, workload=workload, clock=clock)
        self.executor = executor
        self.drop_fraction, self.drop_patience = drop_fraction, drop_patience
        self.max_research_trials = max_research_trials
        self.start_config: Config = executor.config
        self.locked: Trial | None = None
        self.reference: float | None = None
        self.collects = 0
        self.researches = 0
        self._rec: TrialRecorder | None = None
        self._queue: list[tuple[Config, str]] = []
        self._drops = 0
        self._fresh = False  # the collect after a lock-in reconfigure is not monitored
        self._num_steps = 0
        self._research_trials: list[Trial] = []
        self._saved = False
        self.search_share = search_share
        self.search_cost = 0.0  # seconds the search has cost so far (see the class docstring)
        self._paused_from: str | None = None

    @property
    def locked_config(self) -> Config | None:
        return self.locked.config if self.locked else None

    def collect(self, num_steps: int) -> Any:
        """One collect under the current config; returns its rollout, always."""
        if self.t0 is None:
            self._begin(num_steps)
        self._num_steps = num_steps
        c0 = self.clock()
        rollout = self.executor.collect(num_steps)
        seconds = self.clock() - c0
        steps = num_steps * self.executor.num_envs
        sps = throughput_of(rollout, seconds, steps)
        self.collects += 1
        if self.phase in ("explore", "research"):
            best = self.best()
            if best is not None and best.estimate:
                self.search_cost += max(0.0, seconds - steps / best.estimate)
            self._feed(sps)
        elif self.phase == "locked":
            self._monitor(sps)
        elif self.phase == "paused" and not self._over_share():
            self._set_phase(self._paused_from or "explore")
            self._advance()
        return rollout

    def _over_share(self) -> bool:
        if self.search_share is None or self.t0 is None:
            return False
        return self.search_cost > self.search_share * (self.clock() - self.t0)

    def _pause(self) -> None:
        """Run the fastest config measured so far until the search is back within its share."""
        best = self.best(self._research_trials) if self.phase == "research" else None
        best = best or self.best()
        assert best is not None
        if best.config != self.executor.config:
            self.search_cost += float(self.executor.reconfigure(best.config) or 0.0)
        self._paused_from = self.phase
        self._set_phase("paused")
        self._emit("phase", best, best.estimate,
                   f"search paused: it cost {self.search_cost:.1f} s, over {self.search_share:.0%} of the "
                   f"training time; running {best.config} meanwhile")

    # -- phases
    def _begin(self, num_steps: int) -> None:
        self._setup(self.executor, num_steps)
        n = self.executor.num_envs
        # The cached choice first (start at the known best), then start and serial.
        self._queue = [(self.cached[0], "cache")] if self.cached else []
        for c, src in ((self.start_config, "start"), (Config.serial(n), "serial")):
            if all(c != q for q, _ in self._queue):
                self._queue.append((c, src))
        self._set_phase("explore")
        self._advance()

    def _advance(self) -> None:
        """Start the next trial, skipping configs the executor refuses; lock in when none is
        left; pause when the search is over its share of the time."""
        while True:
            if self._over_share() and self.best() is not None and (self._queue or not self.budget_spent()):
                self._pause()
                return
            nxt = self._next()
            if nxt is None:
                self._lock()
                return
            if self._start_trial(*nxt):
                return

    def _start_trial(self, config: Config, source: str) -> bool:
        """Reconfigure (unless already there) and start recording; False if refused."""
        t0 = self.clock()
        trial = Trial(config=config, source=source, started=t0 - (self.t0 or t0))
        warm = None
        if config != self.executor.config:
            try:
                trial.reconfigure_seconds = float(self.executor.reconfigure(config) or 0.0)
                self.search_cost += trial.reconfigure_seconds
            except ConfigError as e:
                trial.status, trial.error, trial.exception = "invalid", str(e), e
                self._record_trial(trial)
                self._emit("trial_end", trial, None, str(trial))
                return False
        elif source == "research":
            warm = 0  # already running this config: nothing to warm up
        self.current = trial
        self._rec = TrialRecorder(trial, self.protocol, warmup=warm, clock=self.clock,
                                  deadline=self.deadline() if self.phase == "explore" else None,
                                  reference=self._reference(source))
        self._emit("trial_start", trial, message=str(config))
        return True

    def _feed(self, sps: float) -> None:
        rec = self._rec
        assert rec is not None
        was_warmup = rec.warmup_left > 0
        done = rec.add(sps)
        if not was_warmup:
            self._emit("sample", rec.trial, sps)
        if not done:
            return
        t = rec.trial
        self._record_trial(t)
        if self.phase == "research":
            self._research_trials.append(t)
        self.current, self._rec = None, None
        self._emit("trial_end", t, t.estimate if t.ok else None, str(t))
        self._advance()

    def _next(self) -> tuple[Config, str] | None:
        if self._queue:
            return self._queue.pop(0)
        if self.phase == "research" or self.budget_spent():
            return None
        self._prepare_strategy(self.executor, self._num_steps)
        self.phase = "explore"
        c = self._next_proposal()
        return (c, "online") if c is not None else None

    def _lock(self) -> None:
        pool = self._research_trials if self.phase == "research" else self.history
        best = self.best(pool) or self.best()
        assert best is not None, "no config was measured"
        if best.config != self.executor.config:
            self.executor.reconfigure(best.config)
            self._fresh = True
        self.locked, self.reference, self.choice = best, best.estimate, best
        self._drops = 0
        self._research_trials = []
        self._set_phase("locked")
        self._emit("locked", best, best.estimate, f"locked in {best.config} at {_fmt(best.estimate)} steps/s")
        self._save()

    def _monitor(self, sps: float) -> None:
        if self._fresh:  # right after the lock-in reconfigure: a warm-up, not a drop
            self._fresh = False
            return
        assert self.reference is not None and self.locked is not None
        self._drops = self._drops + 1 if sps < (1 - self.drop_fraction) * self.reference else 0
        if self._drops < self.drop_patience:
            return
        self._emit("drop", self.locked, sps,
                   f"throughput {_fmt(sps)} < {1 - self.drop_fraction:.0%} of {_fmt(self.reference)} for "
                   f"{self._drops} collects: re-searching around {self.locked.config}")
        self.researches += 1
        locked = self.locked.config
        assert self.space is not None
        near = self.space.neighbours(locked)
        if self._prepared:
            near.sort(key=lambda c: -(self.strategy.predicted(c) or 0.0))
        self._queue = [(locked, "research")] + [(c, "research") for c in near[:max(0, self.max_research_trials - 1)]]
        self._research_trials = []
        self._set_phase("research")
        self._advance()

    def _save(self) -> None:
        if self.cache is None or self._saved:
            return
        self.cache.store(self.result().to_record())
        self._saved = True

    def result(self) -> TuneResult:
        """What was measured so far, as a :class:`TuneResult` (choice: the locked config,
        or the best measured one while exploring)."""
        best = self.locked or self.best()
        if best is None:
            raise AuturiError("no trial has finished yet: call collect() a few more times")
        return TuneResult(
            choice=best.config, reason=(f"online: locked in at {_fmt(best.estimate)} steps/s" if self.locked
                                        else f"online: best so far at {_fmt(best.estimate)} steps/s"),
            trials=list(self.history), final=[], start=self.start_config, num_steps=self._num_steps,
            strategy=self.strategy.info() if self._prepared else {"name": self.strategy.name},
            space=self.space.sizes() if self.space else {}, protocol=self.protocol.to_dict(),
            budget={"trials": self.budget_trials, "seconds": self.budget_seconds},
            hardware=self.hardware, workload=self.workload, seconds=self.elapsed(),
            profile_seconds=self.profile_seconds, cache_hit=self.cached is not None, mode="online")

    def status(self) -> dict[str, Any]:
        s = super().status()
        s.update({"collects": self.collects, "locked_config": _cfg(self.locked_config),
                  "reference_throughput": self.reference, "researches": self.researches,
                  "consecutive_drops": self._drops, "search_cost_seconds": self.search_cost,
                  "search_share": self.search_share})
        return s
