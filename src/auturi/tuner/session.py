"""What the offline and online tuners share (:class:`_Session`): budget, history, the
strategy's preparation, events and ``status()``."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from auturi.config import Config
from auturi.errors import AuturiError
from auturi.tuner.cache import ResultsCache, hardware_fingerprint, open_cache, record_choice, workload_fingerprint
from auturi.tuner.measure import MeasureProtocol, Trial
from auturi.tuner.result import Callback, TunerEvent, _cfg
from auturi.tuner.space import SearchSpace, build_space
from auturi.tuner.strategies import Strategy, make_strategy

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
        self.cached_record: dict[str, Any] | None = None  # the cache record behind ``cached``
        self.choice: Trial | None = None  # the measurement the final choice was made on
        self.profile_seconds = 0.0
        self._prepared = False
        self._own_space = False

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
        self._own_space = self.space is None  # ours to widen once the profile is known
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
            self.cached_record = rec if self.cached else None  # the whole record: what its search left open
            if self.cached and self.mode == "online":
                self._say_cached()

    def _say_cached(self) -> None:
        """One line on stderr: training starts from a layout another run chose, not from the
        user's (a wrapped DummyVecEnv model starting at degree 8 surprised a user who read
        "serial")."""
        import sys

        assert self.cached is not None and self.cache is not None
        config, sps = self.cached
        where = self.cache.path(self.hardware, self.workload)
        then = f", {sps:,.0f} steps/s then" if sps else ""
        print(f"auturi: starting from the layout cached in {where} ({config}{then}); it is confirmed on the first "
              f"collects. To measure afresh: tuner_options={{'cache': False}}, or AUTURI_CACHE_DIR elsewhere",
              file=sys.stderr)

    def _prepare_strategy(self, executor: Any, num_steps: int) -> None:
        if self._prepared:
            return
        assert self.space is not None
        self._set_phase("profiling")
        p0 = self.clock()
        self.strategy.prepare(self.space, executor, num_steps, seed=self.seed)
        # An env that mostly waits (a remote simulator) holds no core while it does: the
        # process cap then counts its processes by their CPU share, so a process per env
        # can be searched on a small machine (16 envs of 1 ms waits on 2 cores: 16 env
        # processes ~9,000 steps/s, the best of the 8-process space ~6,000).
        frac = getattr(getattr(self.strategy, "profile", None), "env_cpu_fraction", 1.0)
        if self._own_space and isinstance(frac, (int, float)) and frac < 1.0:
            wider = build_space(int(executor.num_envs), cores=self.space.cores, devices=self.devices,
                                env_cpu_fraction=frac)
            if len(wider) > len(self.space):
                self.space = wider
                self.strategy.prepare(self.space, executor, num_steps, seed=self.seed)  # profiled already
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
