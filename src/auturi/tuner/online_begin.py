"""The online tuner's opening (:class:`Opening`): what it decides before and at the training's
first collects, and what those found: whether env workers have room beside the training, the
stats of the measured in-process collects that become the model's profile, and the start's
predicted rate where a wrap-time move skipped its measure. The phase machine
(:class:`~auturi.tuner.OnlineTuner`) asks it at those moments and applies the answers (its
queue, its events, its phases); it hands in what the decisions need: the space, the first
collect's stats, and, for a wrap-time move, how to prepare the model and to pick and price a
move.

Why an opening at all: a search pays for itself only if its first moves come early. On
``EARLY_CORES`` cores or more the env workers' server starts before the first collect
(:meth:`Opening.warm_at_begin`; elsewhere during collects nobody times,
:meth:`Opening.unmeasured`); there, one env timed at begin (a copy, in this process) gives the
model its profile before any collect, and where it predicts a layout ``decisive_gain`` times
faster the start is not run at all (:meth:`Opening.at_begin`; measured after all should the
move measure short: :meth:`Opening.start_in_doubt`). Elsewhere the first collect tells whether
env workers have room beside the training (:func:`first_look`); with room, the start may end
at one sample (:meth:`Opening.decisive`) and, on a GPU box, the serial baseline is skipped
(:meth:`Opening.serial_needless`). Since 2026-11-26.

Example (a GPU box's first collect: the envs took 80% of it):
    >>> from auturi import Config
    >>> from auturi.rollout import CollectStats
    >>> stats = CollectStats(steps=16, seconds=1.0, env_seconds=0.8)
    >>> first_look(Config.serial(16), stats, 1.0, 0.9, early_env_share=0.5, cores=16)
    FirstLook(room=True, shares=(0.8, 0.9))
    >>> first_look(Config.serial(16), stats, 1.0, 0.9, early_env_share=0.5, cores=2).room  # a busy core of two
    False
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from auturi.config import Config
from auturi.executor.contract import ExecutorLike
from auturi.tuner.measure import Trial, TrialRecorder
from auturi.tuner.model import predict
from auturi.tuner.online_moves import Moves
from auturi.tuner.online_settings import OnlineSettings
from auturi.tuner.profile import Profile
from auturi.tuner.rollout_profile import profile_at_wrap, profile_from_rollouts, profiles_in_process
from auturi.tuner.space import SearchSpace

EARLY_CORES = 12
"""Cores from which env workers are assumed to fit beside the caller whatever the env's CPU
share, and their server starts before the first collect (:func:`first_look`,
:meth:`Opening.warm_at_begin`): the GPU record's 16-core box ran 16 env workers and the
caller's CUDA loop at 1.2x SB3's SubprocVecEnv. Machines of fewer cores keep the earlier rule
(a server starts when a trial needs it); nothing was measured between 2 and 16 cores."""

IDLE_CPU_SHARE = 0.3
"""A first collect that used at most this share of a core of the caller (CPU time over wall
time) mostly waited: on the envs' simulator or the policy's GPU (the emulated GPU box: 17-20%).
A CPU-bound env on a loaded 2-core machine read 0.5-0.8 (the wall time stretches while other
processes hold the cores), hence the margin."""

WRAP_HORIZON = 8
"""Collects a begin-time move is priced over when the horizon is unknown (the SB3 face
begins at wrap time, before ``learn`` says it): the GPU record's shortest run (32k steps)."""


# -- pure rules
class FirstLook(NamedTuple):
    """What the run's first collect says (:func:`first_look`)."""

    room: bool
    """Env workers have room beside the training here."""
    shares: tuple[float, float] | None
    """The (env, CPU) share of the collect's wall time (None: not read, the start ran its envs elsewhere)."""


def warms_env_server_at_begin(start: Config, cores: int, early_env_share: float | None) -> bool:
    """Whether the online tuner starts the env workers' server at its wrap-time look
    (:meth:`Opening.warm_at_begin`): on ``EARLY_CORES`` cores or more, for a start that steps
    its envs in the caller, unless ``early_env_share`` is off. The SB3 face asks it too, to
    start that server before it builds the executor."""
    return early_env_share is not None and cores >= EARLY_CORES and profiles_in_process(start)


def first_look(config: Config, stats: Any, seconds: float, cpu_seconds: float, *, early_env_share: float | None,
               cores: int) -> FirstLook | None:
    """At the run's first collect (under ``config``, ``seconds`` long, ``cpu_seconds`` of the
    caller's CPU): whether env stepping took ``early_env_share`` of it or more and the machine
    has room for env workers beside it (``EARLY_CORES`` cores or more, or the collect used at
    most ``IDLE_CPU_SHARE`` of a core of the caller: the envs wait on a simulator, the policy
    on a GPU). With room, the start may end at one sample (:meth:`Opening.decisive`) and, after
    this collect, the env workers' server starts, so their first trial, once the profile calls
    for one, need not wait for it. A cheap env on 2 cores (the envs' CPU, all of one core)
    starts nothing: there the server's imports cost 3-5% of a short run for a move that rarely
    pays. A start running its envs in other processes (a SubprocVecEnv user's) has room on a
    GPU box of ``EARLY_CORES``. None: nothing to tell (no ``early_env_share``, no stats)."""
    if early_env_share is None:
        return None
    if not profiles_in_process(config):
        return FirstLook(cores >= EARLY_CORES and config.policy_device != "cpu", None)
    if stats is None or not seconds > 0 or not getattr(stats, "steps", 0):
        return None
    env_share = float(getattr(stats, "env_seconds", 0.0)) / seconds
    cpu_share = cpu_seconds / seconds
    room = env_share >= early_env_share and (cores >= EARLY_CORES or cpu_share <= IDLE_CPU_SHARE)
    return FirstLook(room, (env_share, cpu_share))


def wrap_profile(executor: Any, start: Config, num_steps: int, space: SearchSpace, early_env_share: float,
                 say: Callable[[str], Any]) -> Profile | None:
    """The wrap-time profile: one env (a copy from ``env_fns[0]``, ~0.2 s, then closed) and the
    policy (a copy) timed in this process (:func:`~auturi.tuner.rollout_profile.profile_at_wrap`),
    returned when the envs take ``early_env_share`` of a serial step of ``start`` or more; else
    None, and the first collects profile the model as before. A failure is an optimisation
    lost, not an error: it is said (``say``) and None returned."""
    try:
        prof = profile_at_wrap(executor, start, num_steps, batch_sizes=space.values("policy_batch_size"),
                               devices=space.values("policy_device"), cores=space.cores)
    except Exception as e:
        say(f"no wrap-time profile ({type(e).__name__}: {e}); profiling from the first collects")
        return None
    if prof is None:
        return None
    env = prof.env_step_seconds * executor.num_envs
    pol = prof.policy_latency(start.policy_device, start.policy_batch_size) * math.ceil(
        start.envs_per_actor / start.policy_batch_size)
    if not env > 0 or env / (env + pol) < early_env_share:
        return None
    return prof


def start_prediction(table: Mapping[Config, float], start: Config, prof: Profile) -> float | None:
    """The start's predicted steps/s: the model's ``table``, else the profile's own prediction
    (None: no table)."""
    here = table.get(start) if table else None
    if here is None and table:
        here = predict(start, prof)
    return here


def decisive_top(table: Mapping[Config, float], here: float, gain: float) -> tuple[Config, float] | None:
    """The model's top config and its prediction when that is ``gain`` times ``here`` (the
    start's steps/s, measured or predicted) or more; else None. A gap this wide is far beyond
    the model's usual error (within 1.5x on the 2-core benches) and a few samples' noise."""
    if not table:
        return None
    top, pred = max(table.items(), key=lambda kv: kv[1])
    return (top, pred) if pred >= gain * here else None


def wrap_move(table: Mapping[Config, float], here: float, *, gain: float | None, device: str, collect_steps: int,
              estimate: Callable[[Config], float], horizon: int = WRAP_HORIZON) -> Config | None:
    """Without a horizon, the begin-time move: of the layouts on the start's ``device``
    predicted ``gain`` times the start (``here``) or more, the one whose reconfigure
    (``estimate``) plus ``horizon`` collects of ``collect_steps`` is predicted shortest. Ranked
    by prediction alone (no horizon: the payback rule cannot price), the emulated Pong run's
    first move started 8 CUDA replicas (3.2 s of contexts) for a gain a single replica nearly
    matched."""
    g = gain or 1.0
    ok = [c for c, p in table.items() if c.policy_device == device and p >= g * here]
    return min(ok, key=lambda c: estimate(c) + horizon * collect_steps / table[c], default=None)


# -- the opening's state and decisions
class WrapMove(NamedTuple):
    """A move made at begin (:meth:`Opening.at_begin`)."""

    first: Config
    """What the first collect runs."""
    top: Config
    """The model's top config, and its prediction (``pred``)."""
    pred: float
    here: float
    """The start's predicted steps/s."""


class Opening:
    """One run's opening on ``executor`` under ``settings``, for the ``strategy`` (the model
    where it has ``predictions``) and the ``start`` layout; ``moves`` starts servers and prices
    reconfigures. ``room``: env workers have room beside the training (:func:`first_look`, or a
    wrap-time move); ``shares``: the first collect's (env, CPU) shares; ``start_pred``: the
    start's predicted steps/s where a wrap-time move stands in for its measure (it then stands
    in for the best measured figure when the first move is priced)."""

    def __init__(self, settings: OnlineSettings, executor: ExecutorLike, moves: Moves, strategy: Any, start: Config):
        self.settings, self.executor, self.moves, self.strategy, self.start = settings, executor, moves, strategy, start
        self.room = False
        self.shares: tuple[float, float] | None = None
        self.start_pred: float | None = None
        self.stats: list[Any] = []  # of the measured collects under an in-process layout: the model's profile
        self.unmeasured_seconds = 0.0  # wall seconds of the collects not to measure so far
        self.ahead_tried = False  # unmeasured() started, or declined to start, the server (once per run)
        self.kept_profile = False  # at_begin's profile stands (a start whose collects cannot profile)

    def unmeasured(self, seconds: float, searching: bool) -> bool:
        """After a collect of ``seconds`` nobody times: once such collects reach
        ``warm_ahead_seconds``, while the search has yet to run (``searching``: nothing measured
        or locked), start what a layout of env workers forks from (:meth:`Moves.warm_ahead`);
        True when it started. Its imports then overlap collects nobody times. Not the policy
        processes' server: torch's imports take seconds of a core, which a short warm-up would
        not hide."""
        self.unmeasured_seconds += seconds
        ahead = self.settings.warm_ahead_seconds
        if ahead is None or self.ahead_tried or self.unmeasured_seconds < ahead:
            return False
        self.ahead_tried = True
        return searching and self.moves.warm_ahead()

    def keep_stats(self, config: Config, stats: Any) -> None:
        """Keep a measured collect's stats (a trial's, past its warm-up) where ``config`` times
        its parts as the model needs them (:func:`~auturi.tuner.rollout_profile.profiles_in_process`)."""
        if profiles_in_process(config):
            self.stats.append(stats)

    def give_profile(self, trials: Sequence[Trial], num_steps: int, space: SearchSpace) -> str | None:
        """Before the model is prepared: give it the profile the kept collects' stats hold (of
        the in-process layout among ``trials``:
        :func:`~auturi.tuner.rollout_profile.profile_from_rollouts`), "rollouts"; without
        them (or ``profile_from_rollouts`` off) it profiles the executor itself, "executor";
        None: the strategy has its profile already, or takes none."""
        strat = self.strategy
        if getattr(strat, "profile", False) is not None:
            return None
        stats = [x for x in self.stats if x is not None]
        if not (self.settings.profile_from_rollouts and stats):
            return "executor"
        cfg = next(t.config for t in trials if t.samples and profiles_in_process(t.config))
        strat.profile = profile_from_rollouts(self.executor, stats, cfg, num_steps,
                                              batch_sizes=space.values("policy_batch_size"),
                                              devices=space.values("policy_device"), cores=space.cores)
        return "rollouts"

    def warm_at_begin(self, cores: int) -> bool:
        """Where :func:`warms_env_server_at_begin` says so, start the env workers' server
        before the first collect (the SB3 face begins at wrap time); True when it started. One
        core of many for a fraction of a second, and the first collect then tells whether env
        workers are the move with their server ready, so the move comes right after it."""
        return (warms_env_server_at_begin(self.start, cores, self.settings.early_env_share)
                and self.moves.warm_ahead())

    def look(self, config: Config, stats: Any, seconds: float, cpu_seconds: float, cores: int) -> None:
        """The first collect's look (:func:`first_look`): sets ``room`` where it tells."""
        look = first_look(config, stats, seconds, cpu_seconds, early_env_share=self.settings.early_env_share,
                          cores=cores)
        if look is not None:
            self.room = look.room
            self.shares = look.shares or self.shares

    def at_begin(self, space: SearchSpace, num_steps: int, *, cached: Any, horizon_known: bool,
                 model: Callable[[], Mapping[Config, float] | None], propose: Callable[[], Config | None],
                 pays_back: Callable[[Config], bool], say: Callable[[str], Any]) -> WrapMove | None:
        """On ``EARLY_CORES`` cores or more, before the first collect, with no ``cached``
        choice: give the model the wrap-time profile (:func:`wrap_profile`) and ask it
        (``model``: prepares it, returns its predictions). Where it predicts a layout
        ``decisive_gain`` times the start's prediction or more, the first collect runs the move
        the search would make after a decisive start (``propose``: its proposal ranked by net
        payback, ``start_pred`` standing in for the start's one sample; no horizon:
        :func:`wrap_move`) when it ``pays_back``: the move, promised to ``moves``. As for the
        decisive start's single sample, the 2x margin is the guarantee: the emulated 16-core
        Pong run's first serial rollout took 3-4.5 s against 0.4-0.9 s for a parallel one
        (0.59x of SubprocVecEnv over 8 collects). Else None, the strategy's profile given back
        (the caller unprepares the model: the first collects profile it as before), unless the
        start steps its envs in workers (a SubprocVecEnv user's), whose collects cannot profile
        it: the wrap profile then stands (``kept_profile``), and the start may end at one sample
        on it (:meth:`decisive`)."""
        s, strat, start = self.settings, self.strategy, self.start
        if (s.decisive_gain is None or s.early_env_share is None or space.cores < EARLY_CORES or cached
                or not s.profile_from_rollouts
                or getattr(strat, "predictions", None) is None or getattr(strat, "profile", False) is not None):
            return None
        prof = wrap_profile(self.executor, start, num_steps, space, s.early_env_share, say)
        if prof is None:
            return None
        strat.profile = prof
        table = model() or {}
        here = start_prediction(table, start, prof)
        found = decisive_top(table, here, s.decisive_gain) if here else None
        first = None
        if found is not None:
            self.start_pred = here
            first = propose() if horizon_known else wrap_move(
                table, here, gain=s.decisive_gain, device=start.policy_device, estimate=self.moves.estimate,
                collect_steps=num_steps * self.executor.num_envs)
        if found is None or first is None or first == start or not pays_back(first):
            self.start_pred = None
            if table and not profiles_in_process(start):
                # The start's collects cannot profile the model (its envs step in workers):
                # the wrap profile stands, where profiling the executor later took ~1 s of the
                # caller between collects (a 16-core emulated Pong run's 8 collects: 0.70x of
                # the same layout run fixed).
                self.kept_profile = True
            else:
                strat.profile = None
            return None
        self.moves.promise(first, strat.predicted(first), here)
        self.room = True
        return WrapMove(first, *found, here)

    def early_sample(self, rec: TrialRecorder | None, config: Config, *, warmup_collects: int,
                     waiting: bool) -> bool:
        """Whether a collect under ``config`` timed while the env workers' server starts is
        still the start trial's (``rec``) first sample: only with ``room``, while the start has
        none yet and may end at one (:meth:`decisive`), no other trial ``waiting`` for the
        server. The server's imports read the start slow (40% on 2 cores, little on 16), well
        inside the 2x that decides; unmeasured, the start waited for the server as long as its
        imports took, and the first move with it."""
        return (self.settings.decisive_gain is not None and self.room and rec is not None
                and rec.trial.source == "start" and not rec.trial.samples
                and (rec.warmup_left == 0 or warmup_collects == 0) and not waiting
                and profiles_in_process(config) and getattr(self.strategy, "predictions", None) is not None)

    def decisive(self, trial: Trial, *,
                 model: Callable[[], Mapping[Config, float] | None]) -> tuple[Config, float] | None:
        """Whether the start ``trial`` may end at its first measured sample: the first collect
        found ``room`` for env workers and the model, profiled from the kept collects (``model``
        prepares it; the profile is due then anyway), predicts a layout ``decisive_gain`` times
        faster or more: that layout and its prediction (:func:`decisive_top`), else None. Not
        without room: on 2 cores the model promised a cheap env's 8 envs 2x over serial, which no
        layout delivered. Two more samples of a layout that slow cost the GPU record's 32k-step
        Pong run (8 collects of ~1.3 s serial) a quarter of its training before the first move;
        the start stays measured (one sample) and is the fallback."""
        g = self.settings.decisive_gain
        if (g is None or not self.room or trial.source != "start" or not trial.samples
                or getattr(self.strategy, "predictions", None) is None or not self.settings.profile_from_rollouts
                or not (self.kept_profile or any(x is not None for x in self.stats))):
            return None
        table = model()
        return decisive_top(table, max(trial.samples), g) if table is not None else None

    def start_in_doubt(self, best: float | None, *, start_seen: bool) -> float | None:
        """After a wrap-time move the start is not measured: the model's 2x margin stands for
        it. Once the move measured (``best`` steps/s), if it is not clearly faster than the
        start was predicted (``start_pred``; clearly: the square root of the margin, 1.4x), the
        prediction is in doubt and the start is measured after all (unless ``start_seen``:
        measured or queued already), so the lock-in is never a layout slower than the user's
        own by a misprediction: returns that margin then, else None."""
        if self.start_pred is None or start_seen:
            return None
        margin = math.sqrt(max(1.0, self.settings.decisive_gain or 2.0))
        return margin if best is not None and best < margin * self.start_pred else None

    def serial_needless(self, history: Sequence[Trial]) -> bool:
        """Whether the serial baseline after a start that runs envs or inference elsewhere (a
        SubprocVecEnv user's) is not worth a collect: on a GPU machine with ``room`` for env
        workers, once the start measured. Serial is there for the model's profile (which
        :func:`~auturi.tuner.profile.profile_executor` times in this process in ~0.3 s instead)
        and as a fallback nothing on such a machine falls back to; measured, it cost an
        emulated 16-core Pong run a 2 s serial collect and 1.5-2.7 s restarting 31 env workers
        after it. After a wrap-time move (``start_pred``: the start's prediction stood in for
        its measure) likewise: measured, serial cost an emulated 8-collect run 7 s of its 15 (a
        3.2 s serial collect, 3.7 s restarting 8 CUDA actors). On fewer cores serial is
        measured as before (cheap envs there run fastest serial)."""
        return (self.room and not profiles_in_process(self.start)
                and (self.start_pred is not None or any(t.ok and t.config == self.start for t in history)))
