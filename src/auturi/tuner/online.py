"""Online tuning (:class:`OnlineTuner`): inside training, every collect is the real collect
the learner gets back and one sample for the trial of the config it ran under.

Over 500 lines on purpose (about 960, much of it docstrings): one state machine (confirm,
explore, paused, locked, research) whose phases hand over to each other; split, each half
would need the other's state. The
payback rule (``_payback``, ``discount``, ``_reconfigure_estimate``) reads only the trials and
the reconfigure log: it is the part to move to its own module when it grows again.

What one training run pays for the search, and how it is kept small:

- a cached choice for this machine and workload runs from the first collect (the executor
  is reconfigured before it) and is only confirmed, never re-searched;
- otherwise the start layout's first collects (usually the serial one: the layout plain
  training runs anyway) are the model's profile (:mod:`auturi.tuner.rollout_profile`), and
  the next trial is the predicted best; after it only configs the prediction cannot
  separate from the best measured one are tried (:meth:`ModelStrategy.propose_close`);
- each worker forkserver (env workers': gymnasium; policy processes': torch, seconds of a
  core) starts only when the first trial that forks from it is due, and that trial waits
  until it serves, the training collecting on the current layout meanwhile;
  collects made while they import (``executor.warming``) are the learner's but not measured
  (timed then, the start layout read up to 40% slow and every other layout looked a gain);
  during a long enough stretch of collects nobody times (an off-policy warm-up) the env
  workers' server starts ahead, its imports hidden there (``warm_ahead_seconds``);
- a trial whose first measured sample is clearly slower than the best stops there;
- the search's cost (reconfigures, and each search collect's time beyond what the best
  config so far would have taken) is held under ``search_share`` of the wall time by
  pausing on the best config, so a short run loses at most a few percent and a long one
  finishes the search and locks in;
- the lock-in is the fastest measured config, and the start and serial configs are always
  measured (a confirmed cached choice was measured against them in the run that cached it),
  so it is never a config measured slower than them.

:meth:`OnlineTuner.first_run_cost` (in the record and in ``status()``) says what it cost:
collects and estimated seconds spent off the eventual choice.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from auturi.config import Config
from auturi.errors import AuturiError, ConfigError
from auturi.tuner.measure import MeasureProtocol, Trial, TrialRecorder, throughput_of
from auturi.tuner.result import Callback, TuneResult, _cfg, _fmt
from auturi.tuner.rollout_profile import profile_from_rollouts, profiles_in_process
from auturi.tuner.session import _Session
from auturi.tuner.space import SearchSpace
from auturi.tuner.strategies import Strategy


PROCESS_START_PRIOR = 0.15
"""Seconds one worker process is assumed to add to a reconfigure before this run measured one
(forked warm from a forkserver: 0.05-0.2 s on a 2-core machine; cold, it was 0.5-2 s)."""
SERVER_START_PRIOR = 1.0
"""Seconds of training a worker forkserver's start costs (its imports, torch's above all,
share the cores with the training for a few seconds), charged to a trial whose processes
fork from a server not started yet."""
RECONFIGURE_BASE = 0.03
"""Seconds a reconfigure costs besides starting processes (new control block, moving envs)."""
SEARCH_SOURCES = ("online", "research")
"""Trial sources that are the search's own moves; the start, serial and cached configs are
measured whatever they cost, so their cost says nothing of what the next move will cost
(a remote simulator's serial baseline, 3.7x slower than the best, priced every move at 4.8 s)."""


def declined_now_paying(declined: Sequence[Mapping[str, Any]], left: int | None) -> Mapping[str, Any] | None:
    """The first declined move (an entry of ``OnlineTuner.declined``) that pays back over
    ``left`` collects: its benefit grows with the collects left (the cost does not), at
    ``benefit_per_collect`` each where recorded (a move declined with no collect left to
    gain on still has one), else scaled from the benefit computed for the collects it had
    left then. ``left`` None (unknown): any declined move with a benefit. None when there is
    none.

    >>> d = {"benefit_seconds": 0.0, "benefit_per_collect": 0.1, "cost_seconds": 2.0, "collects_left": 1}
    >>> declined_now_paying([d], 10) is None, declined_now_paying([d], 40) is d
    (True, True)
    """
    for d in declined:
        try:
            benefit, cost, then = float(d["benefit_seconds"]), float(d["cost_seconds"]), d["collects_left"]
            per = float(d["benefit_per_collect"]) if d.get("benefit_per_collect") is not None else None
        except (KeyError, TypeError, ValueError):
            continue
        if per is None:
            per = benefit / float(then) if then else 0.0
        if not (per > 0 and math.isfinite(cost)):
            continue
        if left is None or per * left > cost:
            return d
    return None


def _left_text(left: int | None) -> str:
    return "an unknown number of collects" if left is None else f"{left} collects"


class OnlineTuner(_Session):
    """Tunes inside training: each :meth:`collect` is one real collect that the learner
    gets back, and also one sample for the trial of the config it ran under.

    Phases: ``confirm`` (a cached choice runs from the first collect; confirmed within
    ``confirm_tolerance`` of its cached throughput it is locked in, else the search runs),
    ``explore`` (the start and serial configs, then the strategy's proposals, one trial after
    another; a collect right after a reconfigure is a warm-up: its data is used, its
    throughput is not), ``locked`` (the fastest measured config runs from then on),
    ``research`` (throughput stayed more than ``drop_fraction`` below the locked figure for
    ``drop_patience`` collects in a row: the locked config and its neighbours are
    re-measured and the fastest is locked in), ``paused`` (the search has cost more than
    ``search_share`` of the training's wall time so far: the fastest config measured so far
    runs until the share is back under the limit, then the search goes on).

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
        slower_margin: a search trial stops after its first measured samples when all of them
            are more than this fraction below the best measured config's figure.
        confirm_tolerance: a cached choice is confirmed when it measures within this
            fraction of its cached throughput.
        profile_from_rollouts: the model's profile comes from the start layout's collects
            when that layout is in-process (False: profile the executor, as offline).
        min_gain: a config is tried only where its prediction beats the best measured
            config by at least this fraction (and the trial pays back, see :meth:`_pays_back`):
            a smaller gain is within what the noise of a few samples hides.
        lock_margin: the lock-in stays on the start layout (what plain training runs) unless
            another config measured at least this fraction faster: the fastest of several
            configs measured within noise of each other is fast partly by luck.
        monitor_seconds: once locked in, the drop monitor's samples span consecutive collects
            until they add up to this long: a cheap env's 30 ms collects dip by 15% often
            enough, by noise alone, to start re-searches that cost more than any drop they find.
        self_warming_seconds: a trial's collects at least this long are measured from the
            first (None: the protocol's warm-up always): what a reconfigure leaves to warm up (page
            faults, first wake-ups, lazily built state) is milliseconds, within the protocol's
            noise on such a collect, and discarding one cost a PPO run of 8 long collects an
            eighth of its training at the trial's layout.
        warm_ahead_seconds: once collects the caller said not to measure (an off-policy
            warm-up before ``learning_starts``) have lasted this long while the search has
            yet to run, the env workers' forkserver starts (None: never ahead): its imports
            then overlap collects nobody times, instead of deferring the search's first trial
            of env workers while the training collects serially (a fresh 8-env DQN on a 1 ms
            env waited 0.5 s there). Not the policy processes' server: torch's imports take
            seconds of a core, which a short warm-up would not hide.
        explore_factor: with a known horizon, once nothing the model ranks close pays back, a
            layout family nothing was measured in is tried when, at the model's prediction
            raised by its current error, the trial pays back this many times over (a gamble:
            see :meth:`_exploration`).
        min_sample_seconds: a sample spans consecutive collects until they add up to this
            long (an off-policy collect of one step per env takes a millisecond: a sample of
            one would measure the timer's and the scheduler's noise, not the layout).

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

    def __init__(self, executor: Any, strategy: str | Strategy = "model", *, budget_trials: int | None = 6,
                 budget_seconds: float | None = None, rel_half_width: float = 0.05, min_samples: int = 3,
                 max_samples: int = 5, warmup_collects: int = 1, drop_fraction: float = 0.15,
                 drop_patience: int = 3, max_research_trials: int = 6, space: SearchSpace | None = None,
                 devices: Sequence[str] | None = None, cores: int | None = None, cache: Any = None,
                 callback: Callback | None = None, seed: int = 0, strategy_kwargs: dict[str, Any] | None = None,
                 workload: dict[str, Any] | None = None, clock: Callable[[], float] = time.perf_counter,
                 search_share: float | None = 0.05, slower_margin: float = 0.1, confirm_tolerance: float = 0.10,
                 profile_from_rollouts: bool = True, min_sample_seconds: float = 0.05,
                 min_gain: float = 0.05, lock_margin: float = 0.03, monitor_seconds: float = 0.5,
                 explore_factor: float = 2.0, self_warming_seconds: float | None = 1.0,
                 warm_ahead_seconds: float | None = 0.5):
        if search_share is not None and not 0 < search_share <= 1:
            raise ValueError(f"search_share must be in (0, 1] or None, got {search_share}")
        if not 0 < drop_fraction < 1:
            raise ValueError(f"drop_fraction must be in (0, 1), got {drop_fraction}")
        if drop_patience < 1:
            raise ValueError(f"drop_patience must be >= 1, got {drop_patience}")
        if not 0 <= slower_margin < 1:
            raise ValueError(f"slower_margin must be in [0, 1), got {slower_margin}")
        protocol = MeasureProtocol(rel_half_width=rel_half_width, min_samples=min_samples, max_samples=max_samples,
                                   max_seconds=None, warmup_collects=warmup_collects)
        super().__init__(strategy, budget_trials=budget_trials, budget_seconds=budget_seconds, protocol=protocol,
                         space=space, devices=devices, cores=cores, cache=cache, callback=callback, seed=seed,
                         strategy_kwargs=strategy_kwargs, workload=workload, clock=clock)
        self.executor = executor
        self.drop_fraction, self.drop_patience = drop_fraction, drop_patience
        self.max_research_trials = max_research_trials
        self.search_share, self.slower_margin = search_share, slower_margin
        self.confirm_tolerance = confirm_tolerance
        self.profile_from_rollouts = profile_from_rollouts
        if min_sample_seconds < 0:
            raise ValueError(f"min_sample_seconds must be >= 0, got {min_sample_seconds}")
        self.min_sample_seconds = min_sample_seconds
        if not 0 <= min_gain < 1 or not 0 <= lock_margin < 1:
            raise ValueError(f"min_gain and lock_margin must be in [0, 1), got {min_gain}, {lock_margin}")
        self.min_gain, self.lock_margin = min_gain, lock_margin
        if monitor_seconds < 0:
            raise ValueError(f"monitor_seconds must be >= 0, got {monitor_seconds}")
        self.monitor_seconds = monitor_seconds
        if explore_factor < 1:
            raise ValueError(f"explore_factor must be >= 1, got {explore_factor}")
        self.explore_factor = explore_factor
        if self_warming_seconds is not None and self_warming_seconds <= 0:
            raise ValueError(f"self_warming_seconds must be > 0 or None, got {self_warming_seconds}")
        self.self_warming_seconds = self_warming_seconds
        if warm_ahead_seconds is not None and warm_ahead_seconds < 0:
            raise ValueError(f"warm_ahead_seconds must be >= 0 or None, got {warm_ahead_seconds}")
        self.warm_ahead_seconds = warm_ahead_seconds
        self._unmeasured_seconds = 0.0  # wall seconds of the collects not to measure so far
        self._ahead_tried = False  # _warm_ahead ran (once per tuner)
        self._last_seconds = 0.0  # the last measured collect's wall seconds
        self._warmed = False  # warm_start called (before the first reconfigure that starts processes)
        self._deferred: tuple[Config, str] | None = None  # the trial waiting for warm_start's servers
        self.warming_collects = 0  # collects not measured: the executor was still warming up (warm_start)
        self.unmeasured_collects = 0  # collects the caller said not to measure (collect(measure=False))
        self._search_trials = 0  # finished trials of configs other than start, serial and cached
        self._promised: dict[Config, tuple[float, float]] = {}  # proposed config -> (predicted gain, best then)
        self.realized: list[float] = []  # per search trial: measured gain / predicted gain, in [0, 1]
        self._pending = (0.0, 0)  # (seconds, steps) of the collects of the sample being gathered
        self.start_config: Config = executor.config
        self.locked: Trial | None = None
        self.reference: float | None = None
        self._last_left: int | None = None  # remaining_collects of the previous collect (see _horizon_check)
        self.collects = 0
        self.remaining_collects: int | None = None  # as the caller last said (see collect)
        self.researches = 0
        self.search_cost = 0.0  # seconds the search has cost so far (see the module docstring)
        # ... of which the search trials' (their reconfigures and slow collects): not the start's,
        # serial's or a cached choice's, which are measured whatever they cost
        self.trial_cost = 0.0
        self.profile_source: str | None = None  # "rollouts" or "executor", once profiled
        self.reconfigures: list[dict[str, Any]] = []  # one per reconfigure this tuner made
        self.declined: list[dict[str, Any]] = []  # configs not tried: they would not pay back (_pays_back)
        self.locked_at_collect: int | None = None
        # per config: [collects, seconds, steps] run under it; totals, not a list per collect:
        # an off-policy run makes millions of collects, and first_run_cost() reads this often
        self._log: dict[Config, list] = {}
        self._profile_stats: list[Any] = []  # stats of measured in-process collects
        self._rec: TrialRecorder | None = None
        self._queue: list[tuple[Config, str]] = []
        self._drops = 0
        self._fresh = False  # the collect after a lock-in reconfigure is not monitored
        self._num_steps = 0
        self._research_trials: list[Trial] = []
        self._saved = False
        self._paused_from: str | None = None

    @property
    def locked_config(self) -> Config | None:
        return self.locked.config if self.locked else None

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
        c0 = self.clock()
        rollout = self.executor.collect(num_steps)
        seconds = self.clock() - c0
        self._last_seconds = seconds
        steps = num_steps * self.executor.num_envs
        sps = throughput_of(rollout, seconds, steps)
        self._log_collect(config, seconds, steps)
        if getattr(self.executor, "warming", False):
            # The worker forkservers are still importing on these cores: this collect's data
            # is the learner's as always, its time is not the layout's (it read 40% slow).
            self.warming_collects += 1
        elif self._deferred is not None:  # the servers serve now: the trial that waited starts
            deferred, self._deferred = self._deferred, None
            if not self._start_trial(*deferred):
                self._advance()
        elif self.phase in ("explore", "research", "confirm"):
            rec = self._rec
            if rec is not None and rec.warmup_left == 0 and profiles_in_process(config):
                self._profile_stats.append(getattr(rollout, "stats", None))
            best = self.best()
            if self.phase != "confirm" and best is not None and best.estimate:
                excess = max(0.0, seconds - steps / best.estimate)
                self.search_cost += excess
                if rec is not None and rec.trial.source in SEARCH_SOURCES:
                    self.trial_cost += excess
            self._gather(sps, steps)
        elif self.phase == "locked":
            self._watch(sps, steps)
        elif self.phase == "paused" and not self._over_share():
            self._set_phase(self._paused_from or "explore")
            self._advance()
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
        ahead = self.warm_ahead_seconds
        if ahead is not None and not self._ahead_tried and self._unmeasured_seconds >= ahead:
            self._ahead_tried = True
            self._warm_ahead()
        return rollout

    def _log_collect(self, config: Config, seconds: float, steps: int) -> None:
        """Count one collect, measured or not, under ``config`` (``first_run_cost`` reads these)."""
        self.collects += 1
        tot = self._log.setdefault(config, [0, 0.0, 0])
        tot[0] += 1
        tot[1] += seconds
        tot[2] += steps

    def _warm_ahead(self) -> None:
        """Start the env workers' forkserver during collects nobody times (see
        ``warm_ahead_seconds``), when the search has yet to run and the executor can fork env
        workers for these envs (two or more; a cached choice's layout started its own)."""
        warm, n = getattr(self.executor, "warm_start", None), self.executor.num_envs
        if (not callable(warm) or n < 2 or self.locked is not None or self.history
                or self.phase not in ("idle", "explore")):
            return
        env_workers = Config(num_actors=1, envs_per_actor=n, env_parallel_degree=n)  # valid for every n >= 2
        try:
            if not self._needs_warm(env_workers):
                return
            warm(env_workers)
        except Exception:  # an optimisation only: the trial that needs the server starts it (and says why not)
            return
        self._warmed = True
        self._emit("phase", None, None, "starting the env workers' server during collects not measured")

    def begin(self, num_steps: int) -> None:
        """Start the run now, before the first collect of ``num_steps`` steps per env (a face
        that knows them calls this when it wraps): a cached choice's layout is set up here,
        as a fixed ``config=`` is when its executor is built, instead of inside the first
        collect. Idempotent; :meth:`collect` begins by itself when this was not called."""
        if self.t0 is None:
            self._begin(num_steps)

    # -- reconfigures
    def _reconfigure(self, config: Config) -> tuple[float, dict[str, Any] | None]:
        """Reconfigure the executor; its seconds count as search cost. Returns them and the
        executor's report of what it kept and restarted (``last_reconfigure``), if any."""
        cold = self._needs_warm(config)  # its processes' servers start inside this reconfigure
        secs = float(self.executor.reconfigure(config) or 0.0)
        info = getattr(self.executor, "last_reconfigure", None)
        info = dict(info) if isinstance(info, Mapping) else None
        if info is not None and not secs:
            secs = float(info.get("seconds") or 0.0)
        self.search_cost += secs
        self.reconfigures.append({"to": config.to_dict(), "at_collect": self.collects, "seconds": secs,
                                  **({"executor": info} if info else {}), **({"cold": True} if cold else {})})
        return secs, info

    # -- the start
    def _begin(self, num_steps: int) -> None:
        self._setup(self.executor, num_steps)
        self._num_steps = num_steps
        if self.cached:
            self._set_phase("confirm")
            if self._start_trial(self.cached[0], "cache"):
                return  # runs from the first collect; the search waits for its verdict
        self._queue_baselines()
        self._set_phase("explore")
        self._advance()

    def _queue_baselines(self) -> None:
        """The start config, then serial when it is another one (it usually is the start)."""
        n = self.executor.num_envs
        tried = {t.config for t in self.history}
        for c, src in ((self.start_config, "start"), (Config.serial(n), "serial")):
            if c not in tried and all(c != q for q, _ in self._queue):
                self._queue.append((c, src))

    def _cache_verdict(self, trial: Trial) -> None:
        """After the cached choice's trial: lock it in when it measured close to its cached
        throughput, else search (start and serial first)."""
        assert self.cached is not None
        cached_sps = self.cached[1]
        if trial.ok and (cached_sps is None or trial.estimate >= (1 - self.confirm_tolerance) * cached_sps):
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
                       f"{self.confirm_tolerance:.0%} of its cached {_fmt(cached_sps or math.nan)}: searching")
        self._queue_baselines()
        self._set_phase("explore")
        self._advance()

    def _cached_search_open(self) -> str | None:
        """Why the cached record's search is not this run's answer, or None when it is. A
        record is a run's verdict for its own length: a run that ended before it locked in
        saved its best so far, and one that declined moves because they would not pay back in
        the collects it had left locked in without trying them. A longer run must not inherit
        that: a 2,000-step smoke run cached serial for an env whose 8 env workers collect 4x
        faster, and every later run confirmed serial and locked in. So the search goes on
        when the record never locked in, or when one of its declined moves pays back over the
        collects this run has left (:func:`declined_now_paying`)."""
        online = self._cached_online()
        if online is None:  # no record, or an offline one (auturi tune): a whole search, whatever the length
            return None
        if online.get("locked") is False:
            return "the run that cached it ended before it locked in"
        d = declined_now_paying(online.get("declined") or [], self.remaining_collects)
        if d is None:
            return None
        return (f"the run that cached it declined {Config.from_dict(d['config'])} with {d['collects_left']} collects "
                f"left, which pays back over this run's {_left_text(self.remaining_collects)}")

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
                   f"{_left_text(remaining_collects)} now: {Config.from_dict(d['config'])}, declined with "
                   f"{d['collects_left']} left, pays back: searching on from {self.locked.config}")
        self.locked, self.reference, self._saved = None, None, False
        self.declined = [x for x in self.declined if x is not d]
        self.cached_record = None  # its declines are this search's to make again now
        self._set_phase("explore")
        self._advance()

    # -- the model's profile
    def _prepare_strategy(self, executor: Any, num_steps: int) -> None:
        """Give the model strategy the profile the start layout's collects measured, when
        they can (in-process layout, stats present); else it profiles the executor."""
        if self._prepared:
            return
        strat = self.strategy
        stats = [s for s in self._profile_stats if s is not None]
        if self.profile_from_rollouts and getattr(strat, "profile", False) is None and stats:
            assert self.space is not None
            cfg = next(t.config for t in self.history if t.ok and profiles_in_process(t.config))
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
        if self.remaining_collects is None:
            return close(self.history)
        return close(self.history, key=self._net_payback)  # cheap-to-start configs win close calls

    # -- the search, trial by trial
    def _over_share(self) -> bool:
        """Whether the search has cost more than ``search_share`` of the time so far. Not
        applied when the caller says how many collects remain: each trial must then pay for
        itself (:meth:`_pays_back`), which a pause would only postpone past the run's end."""
        if self.search_share is None or self.t0 is None or self.remaining_collects is not None:
            return False
        return self.search_cost > self.search_share * (self.clock() - self.t0)

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
                   f"search paused: it cost {self.search_cost:.1f} s, over {self.search_share:.0%} of the "
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
                    self.trial_cost += trial.reconfigure_seconds
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

    def _warm_first(self, config: Config, source: str) -> bool:
        """Before a reconfigure that starts worker processes forking from a server not started
        yet: start the servers ``config``'s processes fork from (``warm_start``: the env
        workers' imports gymnasium, a fraction of a second of a core; the policy processes'
        imports torch, seconds) and defer the trial of ``config`` until they serve (True), the
        training collecting on the current layout meanwhile. Started any earlier, those
        imports slowed every run, also those where no other layout pays back (cheap envs: 3-5%
        of a short run); started inside the reconfigure, they stalled the training for their
        whole length."""
        warm = getattr(self.executor, "warm_start", None)
        if (not callable(warm) or source == "cache"  # a cached choice starts at once, as a fixed one
                or self._started_processes(config) == 0 or not self._needs_warm(config)):
            return False
        self._warmed = True
        warm(config)
        if not getattr(self.executor, "warming", False):
            return False
        self._deferred = (config, source)
        self.current, self._rec = None, None
        self._emit("phase", None, None, f"starting the worker servers before trying {config}")
        return True

    def _needs_warm(self, config: Config) -> bool:
        """Whether ``config``'s processes fork from a server not started yet (an executor that
        cannot say: until the first ``warm_start``)."""
        needs = getattr(self.executor, "needs_warm_start", None)
        if callable(needs):
            return bool(needs(config))
        return not self._warmed and callable(getattr(self.executor, "warm_start", None))

    def _warmup_collects(self) -> int:
        """Warm-up collects a trial is expected to discard (the payback rule's estimate): none
        where the last collect lasted ``self_warming_seconds`` or longer (see ``__init__``;
        the trial itself decides on its own first collect, in :meth:`_gather`), else the
        protocol's."""
        long = self.self_warming_seconds is not None and self._last_seconds >= self.self_warming_seconds
        return 0 if long else self.protocol.warmup_collects

    def _started_processes(self, config: Config, origin: Config | None = None) -> int:
        """How many processes a reconfigure from ``origin`` (default: the current layout) to
        ``config`` starts."""
        try:
            from auturi.executor.layout import plan_layout

            return len(plan_layout(origin or self.executor.config).diff(plan_layout(config)).started)
        except Exception:  # a test double's config the planner refuses: assume one process
            return 1

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
        return best is not None and max(trial.samples) < (1 - self.slower_margin) * best.estimate

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
        sample = self._accumulate(sps, steps, self.min_sample_seconds)
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
        if not done:
            return
        t = rec.trial
        self._record_trial(t)
        if t.source in SEARCH_SOURCES:
            self._search_trials += 1
            self._track_record(t)
        if self.phase == "research":
            self._research_trials.append(t)
        self.current, self._rec = None, None
        self._emit("trial_end", t, t.estimate if t.ok else None, str(t))
        if self.phase == "confirm":
            self._cache_verdict(t)
        else:
            self._advance()

    def _next(self) -> tuple[Config, str] | None:
        while self._queue:
            c, source = self._queue.pop(0)
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
            best, pred = self.best(), self.strategy.predicted(c)
            if best is not None and best.estimate and pred:
                self._promised[c] = (1.0 - best.estimate / pred, best.estimate)
            return c, "online"
        # Nothing the model ranks close pays back (or nothing is left): a family of layouts it
        # may rank wrongly, where the run is long enough for the gamble; else lock in.
        x = self._exploration()
        return (x, "online") if x is not None else None

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
        bc = self._payback(c, hopeful)
        if bc is not None and bc[0] > self.explore_factor * bc[1]:
            return c
        self._decline(c, bc, hopeful)
        return None

    # -- does a move pay back before the training ends?
    def _reconfigure_estimate(self, config: Config, started: int | None = None) -> float:
        """Seconds a reconfigure to ``config`` should take: the processes its plan starts times
        what a started process cost in this run's reconfigures so far, those that also started
        a server left out (a prior of ``PROCESS_START_PRIOR`` s before any), plus
        ``RECONFIGURE_BASE`` s; for an executor that
        does not report what it started, the median of this run's reconfigures."""
        started = self._started_processes(config) if started is None else started
        # A reconfigure that started its processes' server (a cached choice applied before
        # the first collect) paid the server's imports too: 1-2 s that no later one pays.
        per = [r["seconds"] / r["executor"]["started"] for r in self.reconfigures
               if r.get("executor", {}).get("started") and not r.get("cold")]
        if per:
            return RECONFIGURE_BASE + started * statistics.median(per)
        whole = [r["seconds"] for r in self.reconfigures if "executor" not in r]  # one that does not say what it started
        if whole:
            return statistics.median(whole)
        return RECONFIGURE_BASE + started * PROCESS_START_PRIOR

    def _payback(self, config: Config, pred: float | None = None) -> tuple[float, float] | None:
        """``(benefit, cost)`` in seconds of trying ``config``, or None when it cannot be told
        (the caller did not say how many collects remain, or nothing is measured yet).

        Benefit: the collects left after the trial's warm-up (its measured collects run at
        the new layout too), each faster by the fraction the model's prediction promises over
        the best measured config, times :meth:`discount` (the share of their promise this
        run's trials delivered; one half before any; the model's optimistic bound, which the
        search itself uses, would make a short run pay for trials a long one can afford).
        Cost: reconfiguring there and back (each priced by the processes it starts: back
        to a layout of fewer processes starts none), and
        the trial's warm-up and first sample at up to half speed (a slower trial stops after
        its first sample), or what this run's search trials cost on average so far, if more
        (their reconfigures and every collect's time beyond the best config's rate). A gain
        below ``min_gain`` weighs nothing."""
        left = self.remaining_collects
        best = self.best()
        if pred is None and self._prepared:
            pred = self.strategy.predicted(config)
        if left is None or best is None or not best.estimate or not pred or not math.isfinite(pred):
            return None
        collect_s = self._num_steps * self.executor.num_envs / best.estimate
        warm = self._warmup_collects()
        per = self._benefit_per_collect(pred)
        if not per:
            return 0.0, 0.0  # within noise: no benefit to weigh (declined: benefit must be > 0)
        benefit = per * max(0, left - warm)
        started = self._started_processes(config)
        back = self._reconfigure_estimate(self.executor.config, self._started_processes(self.executor.config, config))
        cost = self._reconfigure_estimate(config, started) + back + 0.5 * collect_s * (warm + 1)
        if started and self._needs_warm(config):
            cost += SERVER_START_PRIOR  # its processes' server starts first
        if self._search_trials:  # what this run's search trials really cost (slow collects included)
            cost = max(cost, self.trial_cost / self._search_trials)
        return benefit, cost

    def _benefit_per_collect(self, pred: float | None) -> float:
        """Seconds each collect would save at ``pred`` steps/s against the best measured
        config, times :meth:`discount`; 0 for a gain below ``min_gain`` (within noise)."""
        best = self.best()
        if best is None or not best.estimate or not pred or not math.isfinite(pred):
            return 0.0
        gain = max(0.0, 1.0 - best.estimate / pred)
        if gain < self.min_gain:
            return 0.0
        return self.discount() * gain * self._num_steps * self.executor.num_envs / best.estimate

    def discount(self) -> float:
        """How much of a predicted gain a trial is expected to deliver: the mean of this run's
        realized fractions (measured gain / predicted gain, clipped to [0, 1]), with a prior of
        one half worth one trial. A model that keeps promising more than the measurements
        give (a cheap env, where every layout is within noise of serial) stops the search."""
        return (0.5 + sum(self.realized)) / (1 + len(self.realized))

    def _track_record(self, trial: Trial) -> None:
        """After a search trial: what fraction of its predicted gain it delivered."""
        promised = self._promised.pop(trial.config, None)
        if promised is None or promised[0] <= 0:
            return
        gain, best_then = promised
        got = 1.0 - best_then / trial.estimate if trial.ok and trial.estimate > 0 else -1.0
        self.realized.append(min(1.0, max(0.0, got / gain)))

    def _net_payback(self, config: Config, pred: float) -> float:
        """How the online search ranks the configs it may try: benefit minus cost (see
        :meth:`_payback`), or the prediction itself when that cannot be told."""
        bc = self._payback(config, pred)
        return pred if bc is None else bc[0] - bc[1]

    def _pays_back(self, config: Config) -> bool:
        """Whether trying ``config`` is expected to pay for itself before the training ends
        (:meth:`_payback`; always True when the caller did not say how many collects remain).
        A config that does not is recorded in ``declined``."""
        bc = self._payback(config)
        if bc is None or (bc[0] > bc[1] and bc[0] > 0):
            return True
        self._decline(config, bc, self.strategy.predicted(config))
        return False

    def _decline(self, config: Config, bc: tuple[float, float] | None, pred: float | None) -> None:
        """Record in ``declined`` (and say) that ``config`` is not tried: it would not pay back."""
        benefit, cost = bc if bc is not None else (math.nan, math.nan)
        best = self.best()
        self.declined.append({"config": config.to_dict(), "at_collect": self.collects,
                              "collects_left": self.remaining_collects, "predicted": pred,
                              "best": best.estimate if best else None,
                              "benefit_seconds": benefit, "cost_seconds": cost,
                              "benefit_per_collect": self._benefit_per_collect(pred)})
        self._emit("phase", None, None,
                   f"not trying {config}: {self.remaining_collects} collects left; it would save ~{benefit:.2f} s "
                   f"against ~{cost:.2f} s to try it")

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
        if start and max(t.estimate for t in start) * (1 + self.lock_margin) >= best.estimate:
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
        sample = self._accumulate(sps, steps, self.monitor_seconds)
        if sample is not None:
            self._monitor(sample)

    def _monitor(self, sps: float) -> None:
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

    # -- what it cost
    def first_run_cost(self) -> dict[str, Any]:
        """What this run spent off the eventual choice (the locked config, or the best so
        far): ``collects_off_choice``, ``seconds_off_choice`` (for each such collect, its time
        minus what the choice's measured rate would have taken: an estimate, negative when
        those collects happened to be faster), ``reconfigure_seconds`` (all of this tuner's
        reconfigures), and the totals they compare with."""
        choice = self.locked or self.best()
        total = sum(t[1] for t in self._log.values())
        reconf = sum(r["seconds"] for r in self.reconfigures)
        out: dict[str, Any] = {"collects": sum(t[0] for t in self._log.values()), "collect_seconds": total,
                               "reconfigure_seconds": reconf, "reconfigures": len(self.reconfigures),
                               "collects_to_lock": self.locked_at_collect,
                               "collects_off_choice": None, "seconds_off_choice": None}
        if choice is not None and choice.estimate > 0 and math.isfinite(choice.estimate):
            off = [t for c, t in self._log.items() if c != choice.config]
            out["collects_off_choice"] = sum(t[0] for t in off)
            out["seconds_off_choice"] = sum(t[1] - t[2] / choice.estimate for t in off)
        return out

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
            budget={"trials": self.budget_trials, "seconds": self.budget_seconds, "search_share": self.search_share},
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
                  "search_share": self.search_share, "profile_source": self.profile_source,
                  "warming_collects": self.warming_collects, "unmeasured_collects": self.unmeasured_collects,
                  "first_run": self.first_run_cost(),
                  "last_reconfigure": self.reconfigures[-1] if self.reconfigures else None})
        return s
