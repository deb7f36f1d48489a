"""Online tuning (:class:`OnlineTuner`): inside training, every collect is the real collect
the learner gets back and one sample for the trial of the config it ran under.

Over 400 lines on purpose: one state machine (confirm, explore, paused, locked, research)
whose phases hand over to each other, with its trials and drop monitor; split further, each
part would need the others' state. What stands alone is apart: the thresholds
(:mod:`~auturi.tuner.online_settings`), what a move is worth and making it
(:mod:`~auturi.tuner.online_moves`, by the rule of :mod:`~auturi.tuner.payback`). Of the
executor it uses only the contract (:class:`~auturi.executor.contract.ExecutorLike`).

What a run pays for the search is kept small: a cached choice runs from the first collect
and is only confirmed (unless a shorter run cached it: :func:`payback.cached_search_open`);
else the start layout's first collects are the model's profile (the first collect already
starts the env workers' server where the envs took most of it and the machine has room for
them; the start ends at one sample where the profile predicts a layout ``decisive_gain`` times
faster; on ``EARLY_CORES`` cores or more, one env timed at begin (a copy, in this process)
gives the model its profile before any collect, and where it predicts a layout that much
faster the start is not run at all: the first collect runs the search's first move, the 2x
margin standing in for the start's measure as it does for the decisive start's single
sample, since 2026-11-26) and only configs the model
cannot tell from the best measured are tried, each only where it pays back before the
training ends (:mod:`~auturi.tuner.payback`); a move's servers start only when its trial is
due, the training collecting unmeasured meanwhile; a clearly slower trial stops after one
sample; without a known horizon the search pauses past ``search_share`` of the wall time;
the lock-in is never a config measured slower than the start or serial layout (where they
were measured: not after the begin-time move above).
:meth:`OnlineTuner.first_run_cost` (in the record and in ``status()``) says what it cost.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from auturi.config import Config
from auturi.errors import AuturiError, ConfigError
from auturi.executor.contract import as_executor_like
from auturi.tuner import payback
from auturi.tuner.measure import Trial, TrialRecorder, throughput_of
from auturi.tuner.online_moves import Moves, Standing
from auturi.tuner.online_settings import OnlineSettings
from auturi.tuner.profile import predict
from auturi.tuner.payback import (  # noqa: F401 - re-exported: their old home
    PROCESS_START_PRIOR,
    RECONFIGURE_BASE,
    SERVER_START_PRIOR,
    declined_now_paying,
)
from auturi.tuner.result import Callback, TuneResult, _cfg, _fmt
from auturi.tuner.rollout_profile import profile_at_wrap, profile_from_rollouts, profiles_in_process
from auturi.tuner.session import _Session
from auturi.tuner.space import SearchSpace
from auturi.tuner.strategies import Strategy

EARLY_CORES = 12
"""Cores from which env workers are assumed to fit beside the caller whatever the env's CPU
share, and their server starts before the first collect (:meth:`OnlineTuner._first_look`,
``_warm_at_begin``): the GPU record's 16-core box ran 16 env workers and the caller's CUDA
loop at 1.2x SB3's SubprocVecEnv. Machines of fewer cores keep the earlier rule (a server
starts when a trial needs it); nothing was measured between 2 and 16 cores."""

IDLE_CPU_SHARE = 0.3
"""A first collect that used at most this share of a core of the caller (CPU time over wall
time) mostly waited: on the envs' simulator or the policy's GPU (the emulated GPU box: 17-20%).
A CPU-bound env on a loaded 2-core machine read 0.5-0.8 (the wall time stretches while other
processes hold the cores), hence the margin."""

SEARCH_SOURCES = ("online", "research")
"""Trial sources that are the search's own moves; the start, serial and cached configs are
measured whatever they cost, so their cost says nothing of what the next move will cost
(a remote simulator's serial baseline, 3.7x slower than the best, priced every move at 4.8 s)."""


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
        self._pending = (0.0, 0)  # (seconds, steps) of the collects of the sample being gathered
        self._profile_stats: list[Any] = []  # stats of measured in-process collects
        self._research_trials: list[Trial] = []
        self._paused_from: str | None = None
        self._num_steps = 0
        self._last_seconds = 0.0  # the last measured collect's wall seconds
        self._last_left: int | None = None  # remaining_collects of the previous collect (see _horizon_check)
        self._unmeasured_seconds = 0.0  # wall seconds of the collects not to measure so far
        self._ahead_tried = False  # _warm_ahead ran (once per tuner)
        self._first_shares: tuple[float, float] | None = None  # (env, CPU) share of the first collect
        self._room = False  # the first collect said env workers have room here (_first_look)
        self._start_pred: float | None = None  # the start's predicted steps/s at wrap (_decide_at_begin)
        self._at_begin = False  # inside _begin: a move made now is part of the wrap, not deferred (_warm_first)
        # -- the drop monitor's
        self._drops = 0
        self._fresh = False  # the collect after a lock-in reconfigure is not monitored
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
        if self.executor.warming and not self._early_sample(config):
            # What prepare() started (worker servers' imports) runs on these cores: this
            # collect's data is the learner's as always, its time is not the layout's.
            self.warming_collects += 1
        elif self._deferred is not None:  # ready now: the trial that waited starts
            deferred, self._deferred = self._deferred, None
            if not self._start_trial(*deferred):
                self._advance()
        elif self.phase in ("explore", "research", "confirm"):
            rec = self._rec
            if (rec is not None and (rec.warmup_left == 0 or self._warmup_collects() == 0)
                    and profiles_in_process(config)):  # measured: past its warm-up, or long enough to be its own
                self._profile_stats.append(getattr(rollout, "stats", None))
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
        if first and self._room and self.moves.warm_ahead():  # after: it must not make this a warming collect
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
        self._unmeasured_seconds += seconds
        ahead = self.settings.warm_ahead_seconds
        if ahead is not None and not self._ahead_tried and self._unmeasured_seconds >= ahead:
            self._ahead_tried = True
            self._warm_ahead()
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
    def _warm_ahead(self) -> None:
        """During collects nobody times (``OnlineSettings.warm_ahead_seconds``), while the
        search has yet to run, start what a layout of env workers forks from: its imports then
        overlap collects nobody times. Not the policy processes' server: torch's imports take
        seconds of a core, which a short warm-up would not hide."""
        if self.locked is not None or self.history or self.phase not in ("idle", "explore"):
            return
        if self.moves.warm_ahead():
            self._emit("phase", None, None, "starting the env workers' server during collects not measured")

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
        """Reconfigure the executor (:meth:`Moves.reconfigure`); its seconds count as search cost."""
        secs, info = self.moves.reconfigure(config, self.collects)
        self.search_cost += secs
        return secs, info

    def _started_processes(self, config: Config, origin: Config | None = None) -> int:
        return self.moves.started(config, origin)

    def _reconfigure_estimate(self, config: Config, started: int | None = None) -> float:
        return self.moves.estimate(config, started)

    # -- the start
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
        self._warm_at_begin()
        self._at_begin = self._decide_at_begin()
        try:
            self._advance()
        finally:
            self._at_begin = False

    def _warm_at_begin(self) -> None:
        """On ``EARLY_CORES`` cores or more, start the env workers' server before the first
        collect (the SB3 face begins at wrap time): one core of many for a fraction of a
        second, and the first collect then tells whether env workers are the move
        (:meth:`_first_look`) with their server ready, so the move comes right after it."""
        assert self.space is not None
        if (self.settings.early_env_share is not None and self.space.cores >= EARLY_CORES
                and profiles_in_process(self.start_config) and self.moves.warm_ahead()):
            self._emit("phase", None, None, f"{self.space.cores} cores: starting the env workers' server before the "
                                            f"first collect")

    def _queue_baselines(self) -> None:
        """The start config, then serial when it is another one (it usually is the start).
        Serial runs the policy on the start's device: a model on CUDA acted on CUDA in its own
        loop, and an emulated-GPU Pong run spent 5 of its 12 collects measuring serial on the
        CPU after a serial CUDA start, a layout nothing would choose."""
        n = self.executor.num_envs
        tried = {t.config for t in self.history}
        serial = Config.serial(n, self.start_config.policy_device)
        for c, src in ((self.start_config, "start"), (serial, "serial")):
            if c not in tried and all(c != q for q, _ in self._queue):
                self._queue.append((c, src))

    def _cache_verdict(self, trial: Trial) -> None:
        """After the cached choice's trial: lock it in when it measured close to its cached
        throughput, else search (start and serial first)."""
        assert self.cached is not None
        cached_sps, tol = self.cached[1], self.settings.confirm_tolerance
        if trial.ok and (cached_sps is None or trial.estimate >= (1 - tol) * cached_sps):
            open_search = self._cached_search_open()
            if open_search is None:
                self._saved = True  # the cached record stays: it holds the search that found this choice
                self._lock(trial)
                return
            self._emit("phase", trial, trial.estimate,
                       f"cached choice {trial.config} confirmed at {_fmt(trial.estimate)} steps/s, but {open_search}: "
                       f"searching on from it")
        else:
            self._emit("phase", trial, trial.estimate if trial.ok else None,
                       f"cached choice {trial.config} measured {_fmt(trial.estimate)} steps/s, not within "
                       f"{tol:.0%} of its cached {_fmt(cached_sps or math.nan)}: searching")
        self._queue_baselines()
        self._set_phase("explore")
        self._advance()

    def _cached_search_open(self) -> str | None:
        """Why the cached record's search is not this run's answer (it was a shorter run's
        verdict), or None when it is (:func:`payback.cached_search_open`)."""
        return payback.cached_search_open(self._cached_online(), self.remaining_collects)

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

    # -- what the first collects tell for free (a many-core or GPU machine's first moves)
    def _first_look(self, config: Config, stats: Any, seconds: float, cpu_seconds: float) -> None:
        """At the run's first collect: whether env stepping took ``early_env_share`` of it or
        more and the machine has room for env workers beside it (``EARLY_CORES`` cores or more,
        or the collect used at most ``IDLE_CPU_SHARE`` of a core of this process: the envs wait
        on a simulator, the policy on a GPU): then (``self._room``) the start may end at one sample
        (:meth:`_decisive`) and, after this collect, the env workers' server starts
        (:meth:`Moves.warm_ahead`; at :meth:`_begin` already on ``EARLY_CORES`` cores), so
        the first trial of env workers, once the profile calls for one, need not wait for it.
        A cheap env on 2 cores (the envs' CPU, all of one core) starts nothing: there the server's
        imports cost 3-5% of a short run for a move that rarely pays."""
        share = self.settings.early_env_share
        cores = self.space.cores if self.space is not None else 1
        if share is None or self.phase != "explore" or self.cached or self.profile_source == "wrap":
            return  # (wrap: _decide_at_begin already found the room and moved)
        if not profiles_in_process(config):  # a SubprocVecEnv user's start on a GPU box: its workers run
            self._room = cores >= EARLY_CORES and config.policy_device != "cpu"
            return
        if stats is None or not seconds > 0 or not getattr(stats, "steps", 0):
            return
        env_share = float(getattr(stats, "env_seconds", 0.0)) / seconds
        cpu_share = cpu_seconds / seconds
        self._first_shares = (env_share, cpu_share)
        self._room = env_share >= share and (cores >= EARLY_CORES or cpu_share <= IDLE_CPU_SHARE)

    def _decide_at_begin(self) -> bool:
        """On ``EARLY_CORES`` cores or more, before the first collect: time one env (a copy
        from ``env_fns[0]``, ~0.2 s, then closed) and the policy (a copy) in this process
        (:func:`~auturi.tuner.rollout_profile.profile_at_wrap`), and give the model that
        profile. When the envs take ``early_env_share`` of a serial step or more and the model
        predicts a layout ``decisive_gain`` times the start's prediction or more, the start is
        dropped from the queue (and measured after all should the move measure under the square
        root of that margin: :meth:`_start_if_doubtful`) and the first trial is the one the search would make after a
        decisive start (:meth:`_next_proposal`: on the model's device first, ranked by net
        payback with the start's prediction standing in for its one sample), made here, before the first collect (True). The start is not measured
        then: as for the decisive start's single sample, the 2x margin is the guarantee (the
        emulated 16-core Pong run's first serial rollout took 3-4.5 s against 0.4-0.9 s for a
        parallel one: 0.59x of SubprocVecEnv over 8 collects). Else the model is given back
        unprepared, and the first collects profile it as before (False). Nothing here on
        fewer cores."""
        s, space = self.settings, self.space
        assert space is not None
        strat = self.strategy
        if (s.decisive_gain is None or s.early_env_share is None or space.cores < EARLY_CORES or self.cached
                or not s.profile_from_rollouts or not profiles_in_process(self.start_config)
                or getattr(strat, "predictions", None) is None or getattr(strat, "profile", False) is not None):
            return False
        start, n = self.start_config, self.executor.num_envs
        try:
            prof = profile_at_wrap(self.executor, start, self._num_steps, batch_sizes=space.values("policy_batch_size"),
                                   devices=space.values("policy_device"), cores=space.cores)
        except Exception as e:  # an optimisation only: the first collects profile as before
            self._emit("phase", None, None, f"no wrap-time profile ({type(e).__name__}: {e}); profiling from the "
                                            f"first collects")
            return False
        if prof is None:
            return False
        env = prof.env_step_seconds * n
        pol = prof.policy_latency(start.policy_device, start.policy_batch_size) * math.ceil(
            start.envs_per_actor / start.policy_batch_size)
        if not env > 0 or env / (env + pol) < s.early_env_share:
            return False
        saved_space = space
        strat.profile = prof  # type: ignore[attr-defined]
        try:
            self._prepare_strategy(self.executor, self._num_steps)
        except Exception as e:
            self._emit("phase", None, None, f"no wrap-time model ({type(e).__name__}: {e}); profiling from the "
                                            f"first collects")
            table = {}
        else:
            table = strat.predictions()  # type: ignore[attr-defined]
        finally:
            self.phase = "explore"
        here = table.get(start) if table else None
        if here is None and table:
            here = predict(start, prof)
        if not table or not here or not (max(table.values()) >= s.decisive_gain * here):
            strat.profile, self._prepared, self.space = None, False, saved_space  # type: ignore[attr-defined]
            return False
        top, pred = max(table.items(), key=lambda kv: kv[1])
        # The move the search would make after a decisive start (:meth:`_next`), the start's
        # prediction standing in for its one sample: the proposal ranked by net payback.
        self._start_pred = here
        first = self._next_proposal() if self.remaining_collects is not None else self._wrap_move(table, here)
        if first is None or first == start or not self._pays_back(first):
            self._start_pred = None
            strat.profile, self._prepared, self.space = None, False, saved_space  # type: ignore[attr-defined]
            return False
        self.moves.promise(first, strat.predicted(first), here)
        self.profile_source, self._room = "wrap", True
        self._queue = [(first, "online")] + [(c, src) for c, src in self._queue if c != start]
        self._emit("phase", None, here, f"{space.cores} cores, one env timed at wrap: the profile predicts {top} at "
                                        f"{_fmt(pred)} steps/s, {pred / here:.1f}x the start {start}: the first "
                                        f"collect runs {first}")
        return True

    WRAP_HORIZON = 8
    """Collects a begin-time move is priced over when the horizon is unknown (the SB3 face
    begins at wrap time, before ``learn`` says it): the GPU record's shortest run (32k steps)."""

    def _wrap_move(self, table: Mapping[Config, float], here: float) -> Config | None:
        """Without a horizon, the begin-time move: of the layouts on the start's device predicted
        ``decisive_gain`` times the start or more, the one whose reconfigure plus
        ``WRAP_HORIZON`` collects is predicted shortest. Ranked by prediction alone (no horizon:
        the payback rule cannot price), the emulated Pong run's first move started 8 CUDA
        replicas (3.2 s of contexts) for a gain a single replica nearly matched."""
        g, dev = self.settings.decisive_gain or 1.0, self.start_config.policy_device
        steps = self._num_steps * self.executor.num_envs
        ok = [c for c, p in table.items() if c.policy_device == dev and p >= g * here]
        return min(ok, key=lambda c: self.moves.estimate(c) + self.WRAP_HORIZON * steps / table[c], default=None)

    def _serial_needless(self) -> bool:
        """Whether the serial baseline after a start that runs envs or inference elsewhere (a
        SubprocVecEnv user's) is not worth a collect: on a GPU machine with room for env
        workers (``EARLY_CORES``, a CUDA policy: :meth:`_first_look`), once the start measured.
        Serial is there for the model's profile (which :func:`~auturi.tuner.profile.profile_executor`
        times in this process in ~0.3 s instead) and as a fallback nothing on such a machine
        falls back to; measured, it cost an
        emulated 16-core Pong run a 2 s serial collect and 1.5-2.7 s restarting 31 env workers
        after it. On fewer cores serial is measured as before (cheap envs there run fastest
        serial)."""
        return (self._room and not profiles_in_process(self.start_config)
                and any(t.ok and t.config == self.start_config for t in self.history))

    def _early_sample(self, config: Config) -> bool:
        """Whether a collect timed while the env workers' server starts (:meth:`_first_look`)
        is still the start trial's first sample: only while the start has none yet and may end
        at one (:meth:`_decisive`). The server's imports read the start slow (40% on 2 cores,
        little on 16), well inside the 2x that decides; unmeasured, the start waited for the
        server as long as its imports took, and the first move with it."""
        rec = self._rec
        return (self.settings.decisive_gain is not None and self._room and self.phase == "explore"
                and rec is not None and rec.trial.source == "start" and not rec.trial.samples
                and (rec.warmup_left == 0 or self._warmup_collects() == 0)
                and self._deferred is None and profiles_in_process(config)
                and getattr(self.strategy, "predictions", None) is not None)

    def _decisive(self, trial: Trial) -> bool:
        """Whether the start trial may end at its first measured sample: the first collect
        found room for env workers (:meth:`_first_look`) and the model, profiled from that
        collect (the profile is due then anyway), predicts a layout ``decisive_gain`` times
        faster or more. Not elsewhere: on 2 cores the model promised a cheap env's 8 envs 2x
        over serial, which no layout delivered. Two more samples of a layout that slow cost the
        GPU record's 32k-step Pong run (8 collects of ~1.3 s serial) a quarter of its training
        before the first move; the start stays measured (one sample) and is the fallback."""
        g = self.settings.decisive_gain
        preds = getattr(self.strategy, "predictions", None)
        if (g is None or not self._room or trial.source != "start" or self.phase != "explore" or not trial.samples
                or preds is None or not self.settings.profile_from_rollouts
                or not any(x is not None for x in self._profile_stats)):
            return False
        try:
            self._prepare_strategy(self.executor, self._num_steps)
        except Exception as e:  # the profile failing is no reason to stop: the trial goes on, as before
            self._emit("phase", trial, None, f"no early profile ({type(e).__name__}: {e}); measuring the start fully")
            return False
        finally:
            self.phase = "explore"  # profiling was a moment of this phase, as in _next
        table = preds()
        if not table:
            return False
        top, pred = max(table.items(), key=lambda kv: kv[1])
        here = max(trial.samples)
        if not (pred >= g * here):
            return False
        self._emit("phase", trial, here, f"the profile predicts {top} at {_fmt(pred)} steps/s, {pred / here:.1f}x "
                                         f"the start's {_fmt(here)}: moving on after one sample")
        return True

    # -- the model's profile
    def _prepare_strategy(self, executor: Any, num_steps: int) -> None:
        """Give the model strategy the profile the start layout's collects measured, when
        they can (in-process layout, stats present); else it profiles the executor."""
        if self._prepared:
            return
        strat = self.strategy
        stats = [s for s in self._profile_stats if s is not None]
        if self.settings.profile_from_rollouts and getattr(strat, "profile", False) is None and stats:
            assert self.space is not None
            cfg = next(t.config for t in [*self.history, *([self.current] if self.current else [])]
                       if t.samples and profiles_in_process(t.config))
            strat.profile = profile_from_rollouts(  # type: ignore[attr-defined]
                executor, stats, cfg, num_steps, batch_sizes=self.space.values("policy_batch_size"),
                devices=self.space.values("policy_device"), cores=self.space.cores)
            self.profile_source = "rollouts"
        elif getattr(strat, "profile", False) is None:
            self.profile_source = "executor"
        super()._prepare_strategy(executor, num_steps)

    def _next_proposal(self) -> Config | None:
        close = getattr(self.strategy, "propose_close", None)
        if close is None:
            return super()._next_proposal()
        dev = self.start_config.policy_device
        if dev == "cpu":
            if self.remaining_collects is None:
                return close(self.history)
            return close(self.history, key=self._net_payback)  # cheap-to-start configs win close calls
        # A model on CUDA: its own loop acted there, so configs acting there come first; CPU
        # inference only once none of those is left close. On the emulated GPU box the model
        # ranked 32 CPU actors first (its CPU timings free of the env workers' load), and a
        # 98k-step Pong run locked in CPU replicas at 0.4x SubprocVecEnv.
        known = self.remaining_collects is not None

        def key(c: Config, pred: float) -> float:
            value = self._net_payback(c, pred) if known else pred
            return value if c.policy_device == dev else value - 1e12
        return close(self.history, key=key)

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
            except ConfigError as e:
                trial.status, trial.error, trial.exception = "invalid", str(e), e
                self._record_trial(trial)
                self._emit("trial_end", trial, None, str(trial))
                return False
        elif source == "research":
            warm = 0  # already running this config: nothing to warm up
        self.current = trial
        self._pending = (0.0, 0)
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

    def _clearly_slower(self, trial: Trial) -> bool:
        """A search trial whose every measured sample so far is more than ``slower_margin``
        below the best measured figure: the sequential early stop (one sample suffices). Also
        the serial baseline after another start layout (a ``SubprocVecEnv`` user's, RLlib's):
        measured for the model's profile and as the fallback, it cannot be the choice once
        clearly slower than the start; two more samples of it cost an 8,000-step DQN run on a
        1 ms env ~0.1 s of its 2.2 s."""
        if trial.source not in ("online", "serial") or not trial.samples:
            return False
        best = self.best()
        return best is not None and max(trial.samples) < (1 - self.settings.slower_margin) * best.estimate

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
        sample = self._accumulate(sps, steps, self.settings.min_sample_seconds)
        if sample is not None:
            self._feed(sample)

    def _accumulate(self, sps: float, steps: int, span: float) -> float | None:
        """Add one collect (``steps`` at ``sps``) to the pending sample; once its collects
        add up to ``span`` seconds, return their steps/s and start a new one, else None."""
        secs, n = self._pending
        secs, n = secs + steps / sps, n + steps
        if secs < span:
            self._pending = (secs, n)
            return None
        self._pending = (0.0, 0)
        return n / secs

    def _feed(self, sps: float) -> None:
        rec = self._rec
        assert rec is not None
        was_warmup = rec.warmup_left > 0
        done = rec.add(sps)
        if not was_warmup:
            self._emit("sample", rec.trial, sps)
        if not done and self._clearly_slower(rec.trial):
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
            if source == "serial" and self._serial_needless():
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
        """After a wrap-time move (:meth:`_decide_at_begin`) the start is not measured: the
        model's 2x margin stands for it. Once the move measured, if it is not clearly faster
        than the start was predicted (the square root of the margin: 1.4x), the prediction is
        in doubt and the start is measured after all, so the lock-in is never a layout slower than the user's
        own by a misprediction."""
        if (self.profile_source != "wrap" or self._start_pred is None or self.phase == "research"
                or any(t.config == self.start_config for t in self.history)
                or any(c == self.start_config for c, _ in self._queue)):
            return
        best = self.best()
        margin = math.sqrt(max(1.0, self.settings.decisive_gain or 2.0))
        if best is not None and best.estimate < margin * self._start_pred:
            self._queue.insert(0, (self.start_config, "start"))
            self._emit("phase", best, best.estimate,
                       f"{best.config} measured {_fmt(best.estimate)} steps/s, under {margin:.1f}x the start's "
                       f"predicted {_fmt(self._start_pred)}: measuring the start {self.start_config} after all")

    def _exploration(self) -> Config | None:
        """The best-predicted config of a layout family nothing was measured in
        (:meth:`ModelStrategy.propose_family`), when trying it pays back ``explore_factor``
        times over at a hopeful prediction: the central one raised by the model's current
        error (or the best measured figure so raised, if higher). On a 2-core machine the
        model ranked two actors 2% below an env-worker layout that measured 27% slower: only
        a measurement tells such families apart. Only with a known horizon (the gamble must
        have time to pay); recorded in ``declined`` when it would not."""
        propose = getattr(self.strategy, "propose_family", None)
        best = self.best()
        if propose is None or self.remaining_collects is None or best is None or not best.estimate:
            return None
        c = propose(self.history)
        pred = self.strategy.predicted(c) if c is not None else None
        if c is None or not pred:
            return None
        hopeful = max(pred, best.estimate) * math.exp(float(getattr(self.strategy, "model_error", 0.0)))
        said = self.moves.refuse(c, hopeful, self._standing(), factor=self.settings.explore_factor,
                                 unknown_pays=False)
        return c if self._said(said) else None

    # -- does a move pay back before the training ends? (self.moves, by auturi.tuner.payback)
    def _standing(self) -> Standing:
        best = self.best()
        # Before anything is measured, after a wrap-time look: the start's prediction stands in
        # for the best measured figure, so the first move is priced (CUDA contexts) as any other.
        return Standing(best.estimate if best else self._start_pred, self.remaining_collects,
                        self._num_steps * self.executor.num_envs, self._warmup_collects(), self.discount(),
                        self.collects)

    def _payback(self, config: Config, pred: float | None = None) -> tuple[float, float] | None:
        """``(benefit, cost)`` in seconds of trying ``config`` (:meth:`Moves.payback`), or None
        when it cannot be told."""
        if pred is None and self._prepared:
            pred = self.strategy.predicted(config)
        return self.moves.payback(config, pred, self._standing())

    def discount(self) -> float:
        """How much of a predicted gain a trial is expected to deliver (:func:`payback.discount`
        of this run's realized fractions)."""
        return payback.discount(self.moves.realized)

    def _net_payback(self, config: Config, pred: float) -> float:
        """How the online search ranks the configs it may try: benefit minus cost, or the
        prediction itself when that cannot be told."""
        bc = self._payback(config, pred)
        return pred if bc is None else bc[0] - bc[1]

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
            best = self._keep_start(self.best(pool) or self.best(), pool)
        assert best is not None, "no config was measured"
        if best.config != self.executor.config:
            self._reconfigure(best.config)
            self._fresh = True
        self.locked, self.reference, self.choice = best, best.estimate, best
        self.locked_at_collect = self.collects if self.locked_at_collect is None else self.locked_at_collect
        self._drops = 0
        self._pending = (0.0, 0)
        self._research_trials = []
        self._set_phase("locked")
        self._emit("locked", best, best.estimate, f"locked in {best.config} at {_fmt(best.estimate)} steps/s")
        self._save()

    def _keep_start(self, best: Trial | None, pool: Sequence[Trial]) -> Trial | None:
        """``best``, unless the start layout was measured within ``lock_margin`` of it: then
        the start (the fastest of configs within noise of each other is partly luck, and the
        start is what plain training runs)."""
        if best is None or best.config == self.start_config:
            return best
        start = [t for t in pool if t.ok and t.config == self.start_config]
        if start and max(t.estimate for t in start) * (1 + self.settings.lock_margin) >= best.estimate:
            return max(start, key=lambda t: t.estimate)
        return best

    def _watch(self, sps: float, steps: int) -> None:
        """Feed the drop monitor samples of at least ``monitor_seconds`` of collects."""
        if self._fresh:  # right after the lock-in reconfigure: a warm-up, not a drop
            self._fresh = False
            self._pending = (0.0, 0)
            return
        if not (sps > 0 and math.isfinite(sps)):
            return
        sample = self._accumulate(sps, steps, self.settings.monitor_seconds)
        if sample is not None:
            self._monitor(sample)

    def _monitor(self, sps: float) -> None:
        assert self.reference is not None and self.locked is not None
        s = self.settings
        self._drops = self._drops + 1 if sps < (1 - s.drop_fraction) * self.reference else 0
        if self._drops < s.drop_patience:
            return
        self._emit("drop", self.locked, sps,
                   f"throughput {_fmt(sps)} < {1 - s.drop_fraction:.0%} of {_fmt(self.reference)} for "
                   f"{self._drops} collects: re-searching around {self.locked.config}")
        self.researches += 1
        locked = self.locked.config
        assert self.space is not None
        near = self.space.neighbours(locked)
        if self._prepared:
            near.sort(key=lambda c: -(self.strategy.predicted(c) or 0.0))
        self._queue = [(locked, "research")] + [(c, "research") for c in near[:max(0, s.max_research_trials - 1)]]
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
                  "consecutive_drops": self._drops, "search_cost_seconds": self.search_cost,
                  "search_share": self.settings.search_share, "profile_source": self.profile_source,
                  "warming_collects": self.warming_collects, "unmeasured_collects": self.unmeasured_collects,
                  "first_run": self.first_run_cost(),
                  "last_reconfigure": self.reconfigures[-1] if self.reconfigures else None})
        return s
