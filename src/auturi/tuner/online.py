"""Online tuning (:class:`OnlineTuner`): inside training, every collect is the real collect
the learner gets back and one sample for the trial of the config it ran under.

Over 400 lines on purpose: one state machine (confirm, explore, paused, locked, research)
whose phases hand over to each other, with its trials; split further, each part would need
the others' state. The rules it applies are apart, each on explicit inputs: the thresholds
(:mod:`~auturi.tuner.online_settings`), what a move is worth and making it
(:mod:`~auturi.tuner.online_moves`, by :mod:`~auturi.tuner.payback`), the first collects'
decisions (:mod:`~auturi.tuner.online_begin`), what to try next and lock in
(:mod:`~auturi.tuner.online_search`), samples and the drop monitor
(:mod:`~auturi.tuner.online_monitor`). Of the executor it uses only the contract
(:class:`~auturi.executor.contract.ExecutorLike`).

What a run pays for the search is kept small: a cached choice runs from the first collect
and is only confirmed (unless a shorter run cached it: :func:`payback.cached_search_open`);
else the start layout's first collects are the model's profile (where env workers have room,
the start may end at one sample or, on many cores, not run at all: :mod:`~auturi.tuner.online_begin`)
and only configs the model cannot tell from the best measured are tried, each only where it
pays back before the training ends; a move's servers start only when its trial is due, the
training collecting unmeasured meanwhile; a clearly slower trial stops after one sample;
without a known horizon the search pauses past ``search_share`` of the wall time; the lock-in
is never a config measured slower than the start or serial layout (where they were measured).
:meth:`OnlineTuner.first_run_cost` (in the record and in ``status()``) says what it cost.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from auturi.config import Config
from auturi.errors import AuturiError, ConfigError, LostEnvChangesError, WorkerError
from auturi.executor.contract import as_executor_like
from auturi.tuner import online_search, payback
from auturi.tuner.measure import Trial, TrialRecorder, throughput_of
from auturi.tuner.online_begin import EARLY_CORES, IDLE_CPU_SHARE, Opening  # noqa: F401 - the two: their old home
from auturi.tuner.online_monitor import DropMonitor, Span, clearly_slower
from auturi.tuner.online_moves import Moves, Standing
from auturi.tuner.online_search import SEARCH_SOURCES
from auturi.tuner.online_settings import OnlineSettings
from auturi.tuner.payback import (  # noqa: F401 - re-exported: their old home
    PROCESS_START_PRIOR,
    RECONFIGURE_BASE,
    SERVER_START_PRIOR,
    declined_now_paying,
)
from auturi.tuner.result import Callback, TuneResult, _cfg, _fmt
from auturi.tuner.session import _Session
from auturi.tuner.space import SearchSpace
from auturi.tuner.strategies import Strategy



class OnlineTuner(_Session):
    """Tunes inside training: each :meth:`collect` is one real collect that the learner
    gets back, and also one sample for the trial of the config it ran under.

    Phases: ``confirm`` (a cached choice runs from the first collect; confirmed within
    ``confirm_tolerance`` of its cached throughput it is locked in, else the search runs),
    ``explore`` (the start and serial configs, then the strategy's proposals, one trial after
    another; a collect right after a reconfigure is a warm-up: its data is used, its
    throughput is not), ``locked`` (the fastest measured config runs from then on),
    ``research`` (throughput stayed more than ``drop_fraction`` below the locked figure for
    ``drop_patience`` monitor samples in a row: the locked config and its neighbours are
    re-measured and the fastest is locked in), ``paused`` (the search has cost more than
    ``search_share`` of the training's wall time so far: the fastest config measured so far
    runs until the share is back under the limit, then the search goes on).

    Args:
        executor: the training's executor (:class:`~auturi.executor.contract.ExecutorLike`;
            one answering part of the contract gets the defaults for the rest); this object
            never collects more than asked.
        strategy, space, devices, cores, cache, callback, seed, strategy_kwargs, workload:
            as for :class:`Tuner`.
        settings: the thresholds (:class:`~auturi.tuner.online_settings.OnlineSettings`,
            each with its default and why); its fields may also be given as keyword
            arguments, which override ``settings``.
        clock: the time source (tests pass a fake one).

    Example (the serial backend; training would use each rollout):
        >>> from auturi import make_executor
        >>> from auturi.envs import CountingEnv
        >>> from auturi.policy import RandomPolicy
        >>> ex = make_executor([CountingEnv] * 4, RandomPolicy(CountingEnv().action_space), num_envs=4,
        ...                    backend="serial")
        >>> tuner = OnlineTuner(ex, cache=False, budget_trials=2, min_sample_seconds=0)  # 1 collect, 1 sample
        >>> for left in range(11, -1, -1):  # 12 collects in all: say how many remain after each
        ...     rollout = tuner.collect(8, remaining_collects=left)
        >>> rollout.num_steps, rollout.num_envs, tuner.phase
        (8, 4, 'locked')
        >>> ex.close()
    """

    mode = "online"

    def __init__(self, executor: Any, strategy: str | Strategy = "model", settings: OnlineSettings | None = None, *,
                 space: SearchSpace | None = None, devices: Sequence[str] | None = None, cores: int | None = None,
                 cache: Any = None, callback: Callback | None = None, seed: int = 0,
                 strategy_kwargs: dict[str, Any] | None = None, workload: dict[str, Any] | None = None,
                 clock: Callable[[], float] = time.perf_counter, **overrides: Any):
        settings = settings if settings is not None else OnlineSettings()
        self.settings = s = settings.replace(**overrides) if overrides else settings
        super().__init__(strategy, budget_trials=s.budget_trials, budget_seconds=s.budget_seconds,
                         protocol=s.protocol(), space=space, devices=devices, cores=cores, cache=cache,
                         callback=callback, seed=seed, strategy_kwargs=strategy_kwargs, workload=workload, clock=clock)
        self.executor = as_executor_like(executor)
        self.moves = Moves(self.executor, s)  # what a move costs and saves; the reconfigures and declines
        self.start_config: Config = self.executor.config
        self.opening = Opening(s, self.executor, self.moves, self.strategy, self.start_config)  # the first collects
        self.monitor = DropMonitor(s)  # once locked in: drops below the locked figure
        # -- counters in the record and status()
        self.collects = 0
        self.warming_collects = 0  # collects not measured: what prepare() started was still starting
        self.unmeasured_collects = 0  # collects the caller said not to measure (collect(measure=False))
        self.remaining_collects: int | None = None  # as the caller last said (see collect)
        self.researches = 0
        self.search_cost = 0.0  # seconds the search has cost so far (see the module docstring)
        self.profile_source: str | None = None  # "rollouts" or "executor", once profiled
        self.locked: Trial | None = None
        self.reference: float | None = None
        self.locked_at_collect: int | None = None
        # -- the search's state
        self._queue: list[tuple[Config, str]] = []
        self._rec: TrialRecorder | None = None
        self._deferred: tuple[Config, str] | None = None  # the trial waiting for what prepare() started
        self._span = Span()  # the collects of the trial's sample being gathered
        self._research_trials: list[Trial] = []
        self._paused_from: str | None = None
        self._num_steps = 0
        self._last_seconds = 0.0  # the last measured collect's wall seconds
        self._last_left: int | None = None  # remaining_collects of the previous collect (see _horizon_check)
        self._at_begin = False  # inside _begin: a move made now is part of the wrap, not deferred (_warm_first)
        self._saved = False

    @property
    def locked_config(self) -> Config | None:
        return self.locked.config if self.locked else None

    @property
    def search_share(self) -> float | None:
        return self.settings.search_share

    # the record of moves lives in self.moves; read (and, in tests, set) here as before
    reconfigures = property(lambda self: self.moves.reconfigures,
                            lambda self, v: setattr(self.moves, "reconfigures", v))
    declined = property(lambda self: self.moves.declined, lambda self, v: setattr(self.moves, "declined", v))
    realized = property(lambda self: self.moves.realized)
    _log = property(lambda self: self.moves.log)
    # what the opening found lives in self.opening; read (and, in tests, set) here as before
    _room = property(lambda self: self.opening.room)
    _start_pred = property(lambda self: self.opening.start_pred, lambda self, v: setattr(self.opening, "start_pred", v))
    trial_cost = property(lambda self: self.moves.trial_cost,
                          doc="What the search trials cost: not the start's, serial's or a cached choice's, "
                              "which are measured whatever they cost.")

    # -- collects
    def collect(self, num_steps: int, remaining_collects: int | None = None, measure: bool = True) -> Any:
        """One collect under the current config; returns its rollout, always.

        ``remaining_collects``: how many collects the training will still make after this one,
        when the caller knows (SB3's ``learn(total_timesteps)`` does); the tuner then moves to
        another layout only where the move is expected to pay back before the end.

        ``measure=False``: this collect is not like the training's (an off-policy warm-up
        before ``learning_starts`` acts at random and runs no policy): it runs under the
        current config (a cached choice's, once :meth:`begin` set it up) and feeds no trial
        or monitor; the search measures from the first measured collect (its clock, and a
        ``budget_seconds``, run from :meth:`begin` or that collect).
        Measured in the warm-up, an 8-env DQN on a 1 ms env timed two layouts alike that
        differ by 1.3x once the policy acts, and locked in the slower."""
        self.remaining_collects = remaining_collects
        if not measure:
            return self._unmeasured(num_steps)
        if self.t0 is None:
            self._begin(num_steps)
        self._horizon_check(remaining_collects)
        self._num_steps = num_steps
        if self.phase in ("explore", "research", "confirm") and self._rec is None and self._deferred is None:
            # A Ctrl-C landed between one trial's end and the next one's start (the user's
            # next learn() then got a bare AssertionError): start the next one now.
            self._advance()
        config = self.executor.config
        first = self.collects == 0
        cpu0 = time.process_time()
        c0 = self.clock()
        rollout = self.executor.collect(num_steps)
        seconds = self.clock() - c0
        cpu_seconds = time.process_time() - cpu0
        self._last_seconds = seconds
        steps = num_steps * self.executor.num_envs
        sps = throughput_of(rollout, seconds, steps)
        self._log_collect(config, seconds, steps)
        if first:  # before this collect feeds the start trial: whether it may end at one sample
            self._first_look(config, getattr(rollout, "stats", None), seconds, cpu_seconds)
        if self.executor.warming and not (self.phase == "explore" and self.opening.early_sample(
                self._rec, config, warmup_collects=self._warmup_collects(), waiting=self._deferred is not None)):
            # What prepare() started (worker servers' imports) runs on these cores: this
            # collect's data is the learner's as always, its time is not the layout's.
            self.warming_collects += 1
        elif self._deferred is not None:  # ready now: the trial that waited starts
            deferred, self._deferred = self._deferred, None
            if not self._start_trial(*deferred):
                self._advance()
        elif self.phase in ("explore", "research", "confirm"):
            rec = self._rec
            if rec is not None and (rec.warmup_left == 0 or self._warmup_collects() == 0):  # measured
                self.opening.keep_stats(config, getattr(rollout, "stats", None))
            best = self.best()
            if self.phase != "confirm" and best is not None and best.estimate:
                excess = max(0.0, seconds - steps / best.estimate)
                self.search_cost += excess
                if rec is not None and rec.trial.source in SEARCH_SOURCES:
                    self.moves.trial_cost += excess
            self._gather(sps, steps)
        elif self.phase == "locked":
            self._watch(sps, steps)
        elif self.phase == "paused" and not self._over_share():
            self._set_phase(self._paused_from or "explore")
            self._advance()
        if first and self.opening.room and self.moves.warm_ahead():  # after: it must not make this a warming collect
            self._emit("phase", None, None, "the envs took most of the first collect and the machine has room for "
                                            "env workers: starting their server now")
        if remaining_collects == 0 and not self._saved and self.best() is not None:
            self._save()  # training ends before a lock-in: the next run starts from the best so far
        return rollout

    def _unmeasured(self, num_steps: int) -> Any:
        """A collect under the current config, logged but fed to no trial or monitor."""
        config = self.executor.config
        c0 = self.clock()
        rollout = self.executor.collect(num_steps)
        seconds = self.clock() - c0
        self._log_collect(config, seconds, num_steps * self.executor.num_envs)
        self.unmeasured_collects += 1
        if self.opening.unmeasured(seconds, self.locked is None and not self.history
                                   and self.phase in ("idle", "explore")):
            self._emit("phase", None, None, "starting the env workers' server during collects not measured")
        return rollout

    def _log_collect(self, config: Config, seconds: float, steps: int) -> None:
        self.collects += 1
        self.moves.log_collect(config, seconds, steps)

    def begin(self, num_steps: int) -> None:
        """Start the run now, before the first collect of ``num_steps`` steps per env (a face
        that knows them calls this when it wraps): a cached choice's layout is set up here,
        as a fixed ``config=`` is when its executor is built, instead of inside the first
        collect. Idempotent; :meth:`collect` begins by itself when this was not called."""
        if self.t0 is None:
            self._begin(num_steps)

    # -- getting the executor ready for a move, and making it (self.moves)
    def _warm_first(self, config: Config, source: str) -> bool:
        """Defer the trial of ``config`` while the executor gets ready for it (True; see
        :meth:`Moves.must_wait`). A cached choice starts at once, as a fixed config does."""
        if source == "cache" or self._at_begin or not self.moves.must_wait(config):
            return False
        self._deferred = (config, source)
        self.current, self._rec = None, None
        self._emit("phase", None, None, f"starting the worker servers before trying {config}")
        return True

    def _reconfigure(self, config: Config) -> tuple[float, dict[str, Any] | None]:
        """Reconfigure the executor (:meth:`Moves.reconfigure`); its seconds count as search cost.
        A worker of the new layout that fails (an env that cannot be made outside the training
        process, say) ends the executor: the error then says which move the tuner was making
        and how to train without it (a fixed layout that ran, or no tuning)."""
        before = self.executor.config
        try:
            secs, info = self.moves.reconfigure(config, self.collects)
        except WorkerError as e:
            hint = (f"; the online tuner was moving from {before} to {config} to measure it. To train without "
                    f"such layouts, fix the env or pass a fixed layout that ran: auturi.wrap(..., config="
                    f"auturi.{before!r}), or tune=False")
            raise type(e)(e.worker, e.reason + hint, e.traceback, e.config, e.stack) from e
        self.search_cost += secs
        return secs, info

    def _started_processes(self, config: Config, origin: Config | None = None) -> int:
        return self.moves.started(config, origin)

    def _reconfigure_estimate(self, config: Config, started: int | None = None) -> float:
        return self.moves.estimate(config, started)

    # -- the start (its decisions: auturi.tuner.online_begin)
    def _begin(self, num_steps: int) -> None:
        self._setup(self.executor, num_steps)
        assert self.space is not None
        self.moves.cores = self.space.cores  # process starts share them (payback.start_prior)
        self._num_steps = num_steps
        if self.cached:
            self._set_phase("confirm")
            if self._start_trial(self.cached[0], "cache"):
                return  # runs from the first collect; the search waits for its verdict
        self._queue_baselines()
        self._set_phase("explore")
        if self.opening.warm_at_begin(self.space.cores):
            self._emit("phase", None, None, f"{self.space.cores} cores: starting the env workers' server before the "
                                            f"first collect")
        self._at_begin = self._decide_at_begin()
        try:
            self._advance()
        finally:
            self._at_begin = False

    def _queue_baselines(self) -> None:
        self._queue += online_search.baselines(self.start_config, self.history, self._queue)

    def _cache_verdict(self, trial: Trial) -> None:
        """After the cached choice's trial: lock it in when confirmed (:func:`payback.cache_verdict`),
        else search (start and serial first)."""
        assert self.cached is not None
        why = payback.cache_verdict(trial.ok, trial.estimate, self.cached[1], self.settings.confirm_tolerance,
                                    self._cached_online(), self.remaining_collects)
        if why is None:
            self._saved = True  # the cached record stays: it holds the search that found this choice
            self._lock(trial)
            return
        self._emit("phase", trial, trial.estimate if trial.ok else None, f"cached choice {trial.config} {why}")
        self._queue_baselines()
        self._set_phase("explore")
        self._advance()

    def _cached_online(self) -> Mapping[str, Any] | None:
        """The cached record's ``online`` part (None: no record, or an offline one)."""
        online = (self.cached_record or {}).get("online")
        return online if isinstance(online, Mapping) else None

    @property
    def locked_from_cache(self) -> bool:
        """Whether the lock-in is a confirmed cached choice (no search in this run)."""
        return self.locked is not None and self.locked.source == "cache"

    def _horizon_check(self, remaining_collects: int | None) -> None:
        """While locked: when the collects left grew (``learn()`` called again, as a loop of
        ``learn(10_000, reset_num_timesteps=False)`` does), a move declined for the shorter
        horizon may pay back now: then the search goes on from the locked config."""
        last, self._last_left = self._last_left, remaining_collects
        if self.phase != "locked" or last is None or remaining_collects is None or remaining_collects <= last:
            return
        # This run's declined moves, and, after a lock-in on a confirmed cached choice, those
        # of the run that cached it.
        cached = (self._cached_online() or {}).get("declined") or [] if self.locked_from_cache else []
        d = declined_now_paying([*self.declined, *cached], remaining_collects)
        if d is None:
            return
        assert self.locked is not None
        self._emit("phase", self.locked, self.locked.estimate,
                   f"{payback.left_text(remaining_collects)} now: {Config.from_dict(d['config'])}, declined with "
                   f"{d['collects_left']} left, pays back: searching on from {self.locked.config}")
        self.locked, self.reference, self._saved = None, None, False
        self.declined = [x for x in self.declined if x is not d]
        self.cached_record = None  # its declines are this search's to make again now
        self._set_phase("explore")
        self._advance()

    # -- what the first collects tell for free (self.opening: a many-core or GPU machine's first moves)
    def _first_look(self, config: Config, stats: Any, seconds: float, cpu_seconds: float) -> None:
        """At the run's first collect: whether env workers have room here (:meth:`Opening.look`);
        with room the start may end at one sample and, after this collect, their server starts."""
        moved = self.profile_source == "wrap" and not self.opening.kept_profile  # a wrap-time move found it then
        if self.phase == "explore" and not self.cached and not moved:
            self.opening.look(config, stats, seconds, cpu_seconds, self.space.cores if self.space is not None else 1)

    def _decide_at_begin(self) -> bool:
        """The wrap-time move (:meth:`Opening.at_begin`): True when the first collect runs it
        instead of the start, which leaves the queue (measured after all should the move measure
        short: :meth:`_start_if_doubtful`); else the model goes back unprepared (False)."""
        space = self.space
        assert space is not None
        move = self.opening.at_begin(
            space, self._num_steps, cached=self.cached, horizon_known=self.remaining_collects is not None,
            model=lambda: self._model_table(None, "no wrap-time model", "profiling from the first collects"),
            propose=self._next_proposal, pays_back=self._pays_back, say=lambda line: self._emit("phase", message=line))
        if move is None:
            if self.opening.kept_profile:  # the start cannot profile it: the model keeps the wrap profile
                self.profile_source = "wrap"
                return False
            self._prepared, self.space = False, space  # the first collects profile the model, as without a look
            return False
        first, top, pred, here = move
        start = self.start_config
        self.profile_source = "wrap"
        self._queue = [(first, "online")] + [(c, src) for c, src in self._queue if c != start]
        self._emit("phase", None, here, f"{space.cores} cores, one env timed at wrap: the profile predicts {top} at "
                                        f"{_fmt(pred)} steps/s, {pred / here:.1f}x the start {start}: the first "
                                        f"collect runs {first}")
        return True

    def _decisive(self, trial: Trial) -> bool:
        """Whether the start trial may end at its first measured sample (:meth:`Opening.decisive`)."""
        found = self.phase == "explore" and self.opening.decisive(
            trial, model=lambda: self._model_table(trial, "no early profile", "measuring the start fully"))
        if not found:
            return False
        (top, pred), here = found, max(trial.samples)
        self._emit("phase", trial, here, f"the profile predicts {top} at {_fmt(pred)} steps/s, {pred / here:.1f}x "
                                         f"the start's {_fmt(here)}: moving on after one sample")
        return True

    # -- the model's profile
    def _model_table(self, trial: Trial | None, failed: str, instead: str) -> Mapping[Config, float] | None:
        """The model's predictions, prepared now (a moment of the explore phase); None when
        preparing it failed, said as ``failed`` and what the run does ``instead``: an
        optimisation lost, no reason to stop."""
        try:
            self._prepare_strategy(self.executor, self._num_steps)
        except Exception as e:
            self._emit("phase", trial, None, f"{failed} ({type(e).__name__}: {e}); {instead}")
            return None
        finally:
            self.phase = "explore"
        return self.strategy.predictions()  # type: ignore[attr-defined]

    def _prepare_strategy(self, executor: Any, num_steps: int) -> None:
        """Give the model strategy the profile the start layout's collects measured first
        (:meth:`Opening.give_profile`)."""
        if self._prepared:
            return
        assert self.space is not None
        trials = [*self.history, *([self.current] if self.current else [])]
        self.profile_source = self.opening.give_profile(trials, num_steps, self.space) or self.profile_source
        super()._prepare_strategy(executor, num_steps)

    def _next_proposal(self) -> Config | None:
        close = getattr(self.strategy, "propose_close", None)
        if close is None:
            return super()._next_proposal()
        net = self._net_payback if self.remaining_collects is not None else None
        return online_search.propose_close(close, self.history, self.start_config.policy_device, net)

    # -- the search, trial by trial
    def _over_share(self) -> bool:
        """Whether the search has cost more than ``search_share`` of the time so far. Not
        applied when the caller says how many collects remain: each trial must then pay for
        itself (:meth:`_pays_back`), which a pause would only postpone past the run's end."""
        share = self.settings.search_share
        if share is None or self.t0 is None or self.remaining_collects is not None:
            return False
        return self.search_cost > share * (self.clock() - self.t0)

    def _pause(self) -> None:
        """Run the fastest config measured so far until the search is back within its share."""
        best = self.best(self._research_trials) if self.phase == "research" else None
        best = best or self.best()
        assert best is not None
        if best.config != self.executor.config:
            self._reconfigure(best.config)
        self._paused_from = self.phase
        self._set_phase("paused")
        self._emit("phase", best, best.estimate,
                   f"search paused: it cost {self.search_cost:.1f} s, over {self.settings.search_share:.0%} of the "
                   f"training time; running {best.config} meanwhile")

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
        if config != self.executor.config and self._warm_first(config, source):
            return True
        if config != self.executor.config:
            try:
                trial.reconfigure_seconds, trial.reconfigure = self._reconfigure(config)
                if source in SEARCH_SOURCES:
                    self.moves.trial_cost += trial.reconfigure_seconds
            except (ConfigError, LostEnvChangesError) as e:
                # A layout that would recreate envs a callback changed (env_method, set_attr)
                # is one this run cannot have; the executor refused it before changing anything.
                if isinstance(e, LostEnvChangesError) and not e.intact:
                    raise
                trial.status, trial.error, trial.exception = "invalid", str(e), e
                self._record_trial(trial)
                self._emit("trial_end", trial, None, str(trial))
                return False
        elif source == "research":
            warm = 0  # already running this config: nothing to warm up
        self.current = trial
        self._span.reset()
        self._rec = TrialRecorder(trial, self.protocol, warmup=warm, clock=self.clock,
                                  deadline=self.deadline() if self.phase == "explore" else None,
                                  reference=self._reference(source))
        self._emit("trial_start", trial, message=str(config))
        return True

    def _warmup_collects(self) -> int:
        """Warm-up collects a trial is expected to discard (the payback rule's estimate): none
        where the last collect lasted ``self_warming_seconds`` or longer (the trial itself
        decides on its own first collect, in :meth:`_gather`), else the protocol's."""
        long = self.settings.self_warming_seconds
        return 0 if long is not None and self._last_seconds >= long else self.protocol.warmup_collects

    def _gather(self, sps: float, steps: int) -> None:
        """Add one collect to the sample being gathered; feed the sample once its collects
        span ``min_sample_seconds`` (a warm-up collect is fed alone: it is discarded)."""
        rec = self._rec
        assert rec is not None
        if rec.warmup_left > 0 and self._warmup_collects() == 0:
            rec.warmup_left = 0  # this collect was long enough to be its own warm-up (self_warming_seconds)
        if rec.warmup_left > 0 or not (sps > 0 and math.isfinite(sps)):
            self._feed(sps)
            return
        sample = self._span.add(sps, steps, self.settings.min_sample_seconds)
        if sample is not None:
            self._feed(sample)

    def _feed(self, sps: float) -> None:
        rec = self._rec
        assert rec is not None
        was_warmup = rec.warmup_left > 0
        done = rec.add(sps)
        if not was_warmup:
            self._emit("sample", rec.trial, sps)
        if not done and clearly_slower(rec.trial, self.best(), self.settings.slower_margin):
            rec.finish("slower")
            done = True
        if not done and not was_warmup and self._decisive(rec.trial):
            rec.finish("decisive")
            done = True
        if not done:
            return
        t = rec.trial
        self._record_trial(t)
        if t.source in SEARCH_SOURCES:
            self.moves.track(t)
        if self.phase == "research":
            self._research_trials.append(t)
        self.current, self._rec = None, None
        self._emit("trial_end", t, t.estimate if t.ok else None, str(t))
        if self.phase == "confirm":
            self._cache_verdict(t)
        else:
            self._advance()

    def _next(self) -> tuple[Config, str] | None:
        self._start_if_doubtful()
        while self._queue:
            c, source = self._queue.pop(0)
            if source == "serial" and self.opening.serial_needless(self.history):
                self._emit("phase", None, None, f"not measuring serial after {self.start_config} on {self.space.cores} "
                                                f"cores: the model profiles the executor in this process instead")
                continue
            # A re-search's neighbours must pay back too (the locked config's re-measure is free);
            # with a known horizon, a neighbour nothing predicts (a confirmed cached choice: no
            # model was prepared) is not tried.
            if source != "research" or c == self.executor.config:
                return c, source
            if self.remaining_collects is not None and (not self._prepared or self.strategy.predicted(c) is None):
                continue
            if self._pays_back(c):
                return c, source
        if self.phase == "research" or self.budget_spent():
            return None
        self._prepare_strategy(self.executor, self._num_steps)
        self.phase = "explore"
        c = self._next_proposal()
        if c is not None and self._pays_back(c):
            best = self.best()
            self.moves.promise(c, self.strategy.predicted(c), best.estimate if best else None)
            return c, "online"
        # Nothing the model ranks close pays back (or nothing is left): a family of layouts it
        # may rank wrongly, where the run is long enough for the gamble; else lock in.
        x = self._exploration()
        return (x, "online") if x is not None else None

    def _start_if_doubtful(self) -> None:
        """After a wrap-time move: measure the start after all where the move measured short
        of the margin that stood for the start's measure (:meth:`Opening.start_in_doubt`)."""
        if self.profile_source != "wrap" or self.phase == "research":
            return
        best = self.best()
        seen = any(t.config == self.start_config for t in self.history) or any(
            c == self.start_config for c, _ in self._queue)
        margin = self.opening.start_in_doubt(best.estimate if best else None, start_seen=seen)
        if best is not None and margin is not None:
            self._queue.insert(0, (self.start_config, "start"))
            self._emit("phase", best, best.estimate,
                       f"{best.config} measured {_fmt(best.estimate)} steps/s, under {margin:.1f}x the start's "
                       f"predicted {_fmt(self._start_pred)}: measuring the start {self.start_config} after all")

    def _exploration(self) -> Config | None:
        """A family of layouts nothing was measured in (:func:`online_search.family_gamble`),
        when trying it pays back ``explore_factor`` times over at its hopeful prediction. Only
        with a known horizon (the gamble must have time to pay); recorded in ``declined`` when
        it would not."""
        best = self.best()
        if self.remaining_collects is None or best is None or not best.estimate:
            return None
        gamble = online_search.family_gamble(self.strategy, self.history, best.estimate)
        if gamble is None:
            return None
        said = self.moves.refuse(*gamble, self._standing(), factor=self.settings.explore_factor, unknown_pays=False)
        return gamble[0] if self._said(said) else None

    # -- does a move pay back before the training ends? (self.moves, by auturi.tuner.payback)
    def _standing(self) -> Standing:
        best = self.best()
        # Before anything is measured, after a wrap-time look: the start's prediction stands in
        # for the best measured figure, so the first move is priced (CUDA contexts) as any other.
        return Standing(best.estimate if best else self._start_pred, self.remaining_collects,
                        self._num_steps * self.executor.num_envs, self._warmup_collects(), self.discount(),
                        self.collects)

    def discount(self) -> float:
        """How much of a predicted gain a trial is expected to deliver (:func:`payback.discount`
        of this run's realized fractions)."""
        return payback.discount(self.moves.realized)

    def _net_payback(self, config: Config, pred: float) -> float:
        return self.moves.net(config, pred, self._standing())

    def _pays_back(self, config: Config) -> bool:
        """Whether trying ``config`` is expected to pay for itself before the training ends
        (always True when the caller did not say how many collects remain); a config that
        does not is recorded in ``declined``."""
        pred = self.strategy.predicted(config) if self._prepared else None
        return self._said(self.moves.refuse(config, pred, self._standing()))

    def _said(self, refusal: str | None) -> bool:
        """True for no refusal; else says it (an event) and returns False."""
        if refusal is not None:
            self._emit("phase", None, None, refusal)
        return refusal is None

    # -- the lock-in and the drop monitor
    def _lock(self, best: Trial | None = None) -> None:
        if best is None:
            pool = self._research_trials if self.phase == "research" else self.history
            best = online_search.keep_start(self.best(pool) or self.best(), pool, self.start_config,
                                            self.settings.lock_margin)
        assert best is not None, "no config was measured"
        if best.config != self.executor.config:
            self._reconfigure(best.config)
            self.monitor.fresh = True
        self.locked, self.reference, self.choice = best, best.estimate, best
        self.locked_at_collect = self.collects if self.locked_at_collect is None else self.locked_at_collect
        self.monitor.arm()
        self._research_trials = []
        self._set_phase("locked")
        self._emit("locked", best, best.estimate, f"locked in {best.config} at {_fmt(best.estimate)} steps/s")
        self._save()

    def _watch(self, sps: float, steps: int) -> None:
        """Feed the drop monitor (:class:`~auturi.tuner.online_monitor.DropMonitor`); on a
        sustained drop, re-search around the locked config: it and its neighbours."""
        assert self.reference is not None and self.locked is not None
        sample = self.monitor.watch(sps, steps, self.reference)
        if sample is None:
            return
        s = self.settings
        self._emit("drop", self.locked, sample,
                   f"throughput {_fmt(sample)} < {1 - s.drop_fraction:.0%} of {_fmt(self.reference)} for "
                   f"{self.monitor.drops} collects: re-searching around {self.locked.config}")
        self.researches += 1
        assert self.space is not None
        self._queue = online_search.research_queue(self.locked.config, self.space, self.strategy.predicted
                                                   if self._prepared else None, s.max_research_trials)
        self._research_trials = []
        self._set_phase("research")
        self._advance()

    # -- what it cost
    def first_run_cost(self) -> dict[str, Any]:
        """What this run spent off the eventual choice (the locked config, or the best so far):
        see :meth:`Moves.first_run_cost`."""
        return self.moves.first_run_cost(self.locked or self.best(), self.locked_at_collect)

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
            budget={"trials": self.budget_trials, "seconds": self.budget_seconds,
                    "search_share": self.settings.search_share},
            hardware=self.hardware, workload=self.workload, seconds=self.elapsed(),
            profile_seconds=self.profile_seconds, cache_hit=self.cached is not None, mode="online",
            online={"locked": self.locked is not None,
                    "first_run": self.first_run_cost(), "search_cost_seconds": self.search_cost,
                    "warming_collects": self.warming_collects, "unmeasured_collects": self.unmeasured_collects,
                    "profile_source": self.profile_source, "reconfigures": list(self.reconfigures),
                    "declined": list(self.declined), "realized": list(self.realized)})

    def status(self) -> dict[str, Any]:
        s = super().status()
        s.update({"collects": self.collects, "locked_config": _cfg(self.locked_config),
                  "reference_throughput": self.reference, "researches": self.researches,
                  "consecutive_drops": self.monitor.drops, "search_cost_seconds": self.search_cost,
                  "search_share": self.settings.search_share, "profile_source": self.profile_source,
                  "warming_collects": self.warming_collects, "unmeasured_collects": self.unmeasured_collects,
                  "first_run": self.first_run_cost(),
                  "last_reconfigure": self.reconfigures[-1] if self.reconfigures else None})
        return s
