"""Offline tuning (:class:`Tuner`): measure configs on an executor, choose, re-measure the
choice against the start and serial configs, and leave the executor reconfigured.

Over 400 lines: one run in three stages (search, the close finalists' interleaved re-measure,
the confirm rounds) that share the budget's clock and the trials; the protocol they measure
by is :mod:`~auturi.tuner.measure`, what they share with the online tuner
:mod:`~auturi.tuner.session`.

Example:
    >>> import gymnasium as gym, auturi
    >>> from auturi.envs import CountingEnv
    >>> from auturi.tuner import Tuner
    >>> ex = auturi.make_executor(CountingEnv, auturi.RandomPolicy(gym.spaces.Discrete(3)), 4, backend="serial")
    >>> result = Tuner(strategy="grid", budget_trials=3, cache=False).tune(ex, num_steps=8)
    >>> ex.config == result.choice
    True
    >>> ex.close()
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from auturi.config import Config
from auturi.tuner.measure import (
    MAX_COLLECTS_PER_SAMPLE,
    MIN_INTERVAL_SAMPLES,
    MeasureProtocol,
    Trial,
    collects_per_sample,
    measure,
    ratio,
    remeasure_interleaved,
)
from auturi.tuner.result import Callback, TuneError, TuneResult, _fmt
from auturi.tuner.session import _Session
from auturi.tuner.space import SearchSpace, serial_baseline
from auturi.tuner.strategies import Strategy

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
            serial configs in interleaved rounds: at least 3 samples each (in up to 3 rounds,
            fewer when the budget is short), then more rounds, up to this many, while every
            interval is wider than ``rel_half_width`` and another round fits in the budget
            and in ``max_trial_seconds`` per config (which also cap the sample length).
            Each config's sample there is as many collects as its spread in the search needs
            (:func:`~auturi.tuner.measure.collects_per_sample`), so a heavy-tailed env's rare
            slow steps are inside every sample instead of deciding which samples are slow.
            The printed throughput and speed-ups come from these rounds, so the choice's
            figure is not the draw that made it win, and each ratio compares numbers taken in
            the same rounds. Should the choice measure slower than start or serial there, the
            faster of those is the choice. 0 turns this off (the figures then come from the
            samples the choice was made on).
        space / devices / cores: the search space, or what to build it from.
        cache: None (default directory), False (no cache), a directory or a ResultsCache.
        confirm_tolerance: a cached choice is confirmed, and the search skipped, when it
            measures within this fraction of its cached throughput and beats start and serial.
        callback: called with a :class:`TunerEvent` on every step.
        seed: seeds the strategy.
        strategy_kwargs: passed to the strategy's constructor when ``strategy`` is a name.
        workload: extra fields for the workload fingerprint (e.g. ``{"name": "cartpole"}``).

    Example (tune an executor in place; it is left running the choice):

    >>> import auturi, gymnasium as gym
    >>> from auturi.envs import CountingEnv
    >>> policy = auturi.RandomPolicy(gym.spaces.Discrete(3))
    >>> with auturi.make_executor(CountingEnv, policy, num_envs=4, backend="serial") as ex:
    ...     result = auturi.Tuner("grid", budget_trials=3, max_trial_seconds=0.5, cache=False).tune(ex, num_steps=8)
    ...     print(ex.config == result.choice)   # the executor is left running the choice
    True
    >>> [t.source for t in result.trials]        # the start (serial here), then the grid's first two
    ['start', 'search', 'search']
    """

    mode = "offline"

    def __init__(self, strategy: str | Strategy = "model", *, budget_trials: int | None = None,
                 budget_seconds: float | None = None, rel_half_width: float = 0.05, min_samples: int = 3,
                 max_samples: int = 10, max_trial_seconds: float | None = 20.0,
                 protocol: MeasureProtocol | None = None, top_k: int = 3, final_rounds: tuple[int, int] = (2, 3),
                 final_samples: int = 2, confirm_rounds: int = 6,
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
        self._taken: dict[int, int] = {}  # samples taken by id(trial) in the interleaved rounds (before regrouping)

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
            if config == serial_baseline(config):  # no layout to skip: the env fails on its own
                raise TuneError(f"tuning stopped: {config} failed ({t.error}). That is the serial layout (every "
                                f"env in this process): the env itself fails, whatever the layout; fix it (its "
                                f"traceback is this error's cause).", list(self.history),
                                env_fails=True) from t.exception
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
        start = executor.config
        serial = serial_baseline(start)
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
            confirm = self._confirm(executor, [candidate.config, start, serial], num_steps, plan)
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
                    "confirm_rounds": self._rounds_run(plan[1]), "confirm_samples_per_round": plan[1],
                    "confirm_collects_per_sample": {str(t.config): t.collects_per_sample for t in self.final
                                                    if t.source == "confirm"}},
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

    def _confirm(self, executor: Any, configs: list[Config], num_steps: int,
                 plan: tuple[int, int, float, dict[Config, int]]) -> list[Trial]:
        """The rounds after the choice (see ``confirm_rounds``): at least 3 samples each, then
        more rounds while the intervals are wide and the budget allows; a tight ranking does
        not end them (their point is the printed ratios, not the ranking)."""
        rounds, per, _, _ = plan
        configs = list(dict.fromkeys(configs))
        cap = self._collects_cap(configs)
        # The final rounds' collects count too; the budget caps the length.
        collects = {c: min(self._collects_per_sample(c), cap.get(c, MAX_COLLECTS_PER_SAMPLE)) for c in configs}
        return self._remeasure(executor, configs, num_steps,
                               rounds=(rounds, max(rounds, self.confirm_rounds)), samples=per, source="confirm",
                               deadline=self._confirm_deadline(len(configs)), min_collects=collects,
                               max_collects=cap, resize=True, stop_when_separated=False,
                               budget_min_samples=MIN_INTERVAL_SAMPLES)

    def _confirm_seconds(self, n_configs: int) -> float:
        """Seconds the confirm rounds may take: what is left of ``budget_seconds``, and at
        most the protocol's ``max_seconds`` (a trial's cap) per config (inf: no limit)."""
        left = math.inf if self.budget_seconds is None or self.t0 is None else \
            max(0.0, self.t0 + self.budget_seconds - self.clock())
        per_config = self.protocol.max_seconds
        return left if per_config is None else min(left, per_config * n_configs)

    def _confirm_deadline(self, n_configs: int) -> float | None:
        seconds = self._confirm_seconds(n_configs)
        return None if math.isinf(seconds) else self.clock() + seconds

    def _collects_cap(self, configs: list[Config]) -> dict[Config, int]:
        """The most collects per confirm sample for each config such that 3 samples of every
        one fit in the confirm's seconds (:meth:`_confirm_seconds`, an equal share each; at
        least 1), so a spread made by a busy machine cannot make the confirm overrun the
        budget, or a trial's ``max_seconds``, by much. Empty without either limit."""
        seconds = self._confirm_seconds(len(configs))
        if math.isinf(seconds):
            return {}
        share = seconds / max(1, len(configs))
        cap = {}
        for c in configs:
            reconf, per_collect = self._collect_seconds(c)
            room = share - reconf - per_collect * self.protocol.warmup_collects
            cap[c] = MAX_COLLECTS_PER_SAMPLE if per_collect <= 0 else \
                max(1, min(MAX_COLLECTS_PER_SAMPLE, int(room / (MIN_INTERVAL_SAMPLES * per_collect))))
        return cap

    def _remeasure(self, executor: Any, configs: list[Config], num_steps: int, *, rounds: int | tuple[int, int],
                   samples: int, source: str, deadline: float | None, **kw: Any) -> list[Trial]:
        """Interleaved rounds of ``configs`` (see :func:`remeasure_interleaved`, which takes
        ``kw``), kept in ``final``."""
        lo, hi = (rounds, rounds) if isinstance(rounds, int) else rounds
        began = self.elapsed()
        try:
            trials = remeasure_interleaved(executor, configs, num_steps, self.protocol, min_rounds=lo, max_rounds=hi,
                                           samples_per_round=samples, clock=self.clock, deadline=deadline,
                                           source=source, on_sample=self._final_sample, **kw)
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

    def _rounds_run(self, per_round: int) -> int:
        """How many confirm rounds ran (the most samples a confirm trial took, before any
        regrouping, over the samples per round)."""
        n = max((self._taken.get(id(t), t.n) for t in self.final if t.source == "confirm"), default=0)
        return -(-n // per_round) if per_round else 0

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
        self._taken[id(trial)] = self._taken.get(id(trial), 0) + 1
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

    def _visit_cost(self, config: Config, samples: int, collects: int = 1) -> float:
        """Seconds one visit of the interleaved re-measure (reconfigure, warm-up, ``samples``
        samples of ``collects`` collects) should take, from the config's search trial."""
        reconf, per_collect = self._collect_seconds(config)
        return reconf + per_collect * (self.protocol.warmup_collects + samples * collects)

    def _collect_seconds(self, config: Config) -> tuple[float, float]:
        """``(reconfigure seconds, seconds per collect)`` of ``config``'s search trial (zeros
        when it has none)."""
        t = next((t for t in self.history if t.config == config and t.ok), None)
        if t is None:
            return 0.0, 0.0
        n_collects = len(t.warmup) + (len(t.collect_rates) or len(t.samples))
        return t.reconfigure_seconds, max(0.0, t.seconds - t.reconfigure_seconds) / max(1, n_collects)

    def _collects_per_sample(self, config: Config) -> int:
        """Collects per sample for ``config``'s confirm rounds, from the spread of its single
        collects in every earlier trial (:func:`collects_per_sample`)."""
        rates = [r for t in self.history + self.final if t.config == config for r in t.collect_rates]
        return collects_per_sample(rates)

    def _confirm_plan(self, configs: list[Config]) -> tuple[int, int, float, dict[Config, int]]:
        """``(rounds, samples per round, estimated seconds, collects per sample by config)``
        of the confirm rounds' first part: at least 3 samples each (an interval needs them),
        in as many interleaved rounds, up to 3, as what is left of ``budget_seconds`` allows
        (one round of 3 samples when even two rounds do not fit), but none where the choice,
        start and serial are one config and the budget is spent: nothing is compared, and a
        budget shorter than one collect was overrun 32-fold by re-measuring the one config
        measured (2026-11-27); its search samples stand."""
        if self.confirm_rounds <= 0:
            return 0, 0, 0.0, {}
        configs = list(dict.fromkeys(configs))
        collects = {c: self._collects_per_sample(c) for c in configs}
        left = math.inf if self.budget_seconds is None or self.t0 is None else \
            self.t0 + self.budget_seconds - self.clock()
        if len(configs) == 1 and left <= 0:
            return 0, 0, 0.0, {}
        for rounds in range(min(self.confirm_rounds, MIN_INTERVAL_SAMPLES), 0, -1):
            per = -(-MIN_INTERVAL_SAMPLES // rounds)
            cost = rounds * sum(self._visit_cost(c, per, collects[c]) for c in configs)
            if cost <= left or rounds == 1:
                return rounds, per, cost, collects
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
