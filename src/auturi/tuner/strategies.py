"""Search strategies: which config to measure next. One interface, three strategies.

Over 400 lines on purpose: the three strategies share one small interface and helpers
(tried/measured configs, distances, families); each is read against the others.

A strategy is prepared once with the search space, then asked ``propose(history)`` until it
returns None or the tuner's budget runs out. ``history`` holds every trial so far, the
tuner's own (start, serial, cache) included, so a strategy never re-measures a config.

- ``grid``: every config in the space, in order. The reference, and the most expensive.
- ``optuna``: Optuna's TPE sampler over the knobs (seeded, define-by-run so degree, replicas
  and batch size are drawn from the values valid for the sampled actor size); a combination
  that is not in the space is told to Optuna as pruned. Needs ``pip install optuna``.
- ``model`` (the default): profiles the parts once, predicts every config's throughput
  (:mod:`auturi.tuner.model`), measures the most promising, refits the model's costs and
  corrects its predictions near every measured config, and stops when no unmeasured config
  is predicted to beat the best measured one and the best one's neighbours have been tried.

Example:
    >>> from auturi.tuner.space import build_space
    >>> from auturi.tuner.strategies import make_strategy
    >>> s = make_strategy("grid")
    >>> s.prepare(build_space(4, cores=2, devices=["cpu"]))
    >>> s.propose([]).num_envs
    4
"""
from __future__ import annotations

import contextlib
import logging
import math
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from auturi.config import Config
from auturi.tuner.measure import Trial
from auturi.tuner.model import fit_overheads, predict
from auturi.tuner.profile import Profile, profile_executor
from auturi.tuner.space import SearchSpace

# The knobs a strategy moves: all but envs_per_actor, which num_actors and the workload's
# num_envs fix.
KNOBS = tuple(k for k in Config.knob_names() if k != "envs_per_actor")


class Strategy:
    """Base class. Subclasses implement :meth:`propose`."""

    name = "strategy"
    default_budget_trials: int | None = None
    """Trials the tuner allows when the user sets no budget (None: the strategy's own stop)."""

    def __init__(self) -> None:
        self.space: SearchSpace | None = None
        self.seed = 0

    def prepare(self, space: SearchSpace, executor: Any = None, num_steps: int | None = None,
                seed: int = 0) -> None:
        """Called once before the first proposal (the model strategy profiles here)."""
        self.space = space
        self.seed = seed

    def propose(self, history: Sequence[Trial]) -> Config | None:
        """The next config to measure, or None when the strategy is done."""
        raise NotImplementedError

    def predicted(self, config: Config) -> float | None:
        """The strategy's prediction for ``config`` (steps/s), if it makes one."""
        return None

    def info(self) -> dict[str, Any]:
        """What the results record keeps about the strategy."""
        return {"name": self.name}

    def _space(self) -> SearchSpace:
        if self.space is None:
            raise RuntimeError(f"{type(self).__name__}.prepare(space) must be called before propose()")
        return self.space


def _tried(history: Sequence[Trial]) -> set[Config]:
    return {t.config for t in history}


def _measured(history: Sequence[Trial]) -> dict[Config, float]:
    """Mean throughput of every successfully measured config (the latest trial wins)."""
    out: dict[Config, float] = {}
    for t in history:
        if t.ok:
            out[t.config] = t.estimate
    return out


# ---------------------------------------------------------------------------- grid
class GridStrategy(Strategy):
    """Every config of the space, in the space's order: the exhaustive reference."""

    name = "grid"

    def propose(self, history: Sequence[Trial]) -> Config | None:
        tried = _tried(history)
        for c in self._space().configs:
            if c not in tried:
                return c
        return None


# ---------------------------------------------------------------------------- optuna
@contextlib.contextmanager
def _quiet_optuna(optuna: Any) -> Iterator[None]:
    # Optuna logs every trial at INFO; the tuner reports trials itself. Restore the user's
    # level afterwards rather than silencing Optuna for the whole process.
    old = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(old)


class OptunaStrategy(Strategy):
    """Optuna ask/tell over the knobs, maximising measured throughput.

    The knobs are sampled define-by-run: ``num_actors`` first, then degree, replicas and
    batch size from the values the space has for that many envs per actor (so a
    parameter is named after its actor size, e.g. ``policy_batch_size|E=8``), then the
    device. A combination that is not in the space (a pruned point) is told as pruned
    and sampling goes on. Trials measured outside the strategy (start, serial, cache) are
    added to the study so the sampler learns from them. Seeded by the tuner's ``seed``.
    When it samples a config already measured, an untried neighbour of that config is
    measured instead; after ``max_attempts`` pruned samples in a row, an untried config at
    random.
    """

    name = "optuna"
    default_budget_trials = 20

    def __init__(self, sampler: Any = None, max_attempts: int = 30):
        super().__init__()
        self.sampler = sampler
        self.max_attempts = max_attempts
        self._study: Any = None
        self._pending: tuple[Any, Config] | None = None
        self._told: set[int] = set()  # ids of history trials already in the study
        self._values: dict[str, list] = {}

    def prepare(self, space: SearchSpace, executor: Any = None, num_steps: int | None = None,
                seed: int = 0) -> None:
        super().prepare(space, executor, num_steps, seed)
        try:
            import optuna
        except ImportError:
            raise ImportError("the 'optuna' strategy needs Optuna: pip install optuna "
                              "(or pip install 'auturi[tune]'), or use strategy='model'") from None
        self._optuna = optuna
        sampler = self.sampler or optuna.samplers.TPESampler(seed=seed)
        with _quiet_optuna(optuna):
            self._study = optuna.create_study(direction="maximize", sampler=sampler)
        # The choices of every (possibly conditional) parameter, from the space itself.
        vals: dict[str, set] = {}
        for c in space.configs:
            for name, v in self._param_items(c):
                vals.setdefault(name, set()).add(v)
        self._values = {k: sorted(v, key=lambda x: (str(type(x)), x)) for k, v in vals.items()}
        self._rng = random.Random(seed)

    @staticmethod
    def _param_items(c: Config) -> list[tuple[str, Any]]:
        e = c.envs_per_actor
        return [("num_envs", c.num_envs), ("num_actors", c.num_actors),
                (f"env_parallel_degree|E={e}", c.env_parallel_degree),
                (f"policies_per_actor|E={e}", c.policies_per_actor),
                (f"policy_batch_size|E={e}", c.policy_batch_size), ("policy_device", c.policy_device)]

    def _suggest(self, ot: Any) -> Config | None:
        n = ot.suggest_categorical("num_envs", self._values["num_envs"])
        a = ot.suggest_categorical("num_actors", self._values["num_actors"])
        if n % a:
            return None
        e = n // a
        knobs = {}
        for k in ("env_parallel_degree", "policies_per_actor", "policy_batch_size"):
            choices = self._values.get(f"{k}|E={e}")
            if not choices:
                return None
            knobs[k] = ot.suggest_categorical(f"{k}|E={e}", choices)
        dev = ot.suggest_categorical("policy_device", self._values["policy_device"])
        try:
            c = Config(num_actors=a, envs_per_actor=e, policy_device=dev, **knobs)
        except ValueError:
            return None
        return c if c in self._space() else None

    def _sync(self, history: Sequence[Trial]) -> None:
        """Tell the pending trial its result; add trials measured by others."""
        optuna = self._optuna
        if self._pending is not None:
            ot, cfg = self._pending
            done = [t for t in history if t.config == cfg]
            if done:
                t = done[-1]
                if t.ok:
                    self._study.tell(ot, t.estimate)
                else:
                    self._study.tell(ot, state=optuna.trial.TrialState.FAIL)
                self._told.add(id(t))
                self._pending = None
        for t in history:
            if id(t) in self._told or not t.ok:
                continue
            self._told.add(id(t))
            items = dict(self._param_items(t.config))
            if all(k in self._values and v in self._values[k] for k, v in items.items()):
                dists = {k: optuna.distributions.CategoricalDistribution(self._values[k]) for k in items}
                self._study.add_trial(optuna.trial.create_trial(params=items, distributions=dists, value=t.estimate))

    def propose(self, history: Sequence[Trial]) -> Config | None:
        space = self._space()
        tried = _tried(history)
        if all(c in tried for c in space.configs):
            return None
        optuna = self._optuna
        with _quiet_optuna(optuna):
            self._sync(history)
            measured = _measured(history)
            for _ in range(self.max_attempts):
                ot = self._study.ask()
                cfg = self._suggest(ot)
                if cfg is None:  # a pruned point: teach the sampler to avoid it
                    self._study.tell(ot, state=optuna.trial.TrialState.PRUNED)
                elif cfg in tried:
                    # The sampler wants to exploit a measured point. Tell it the known value,
                    # and measure an untried neighbour instead (added to the study once
                    # measured): re-asking until something new comes up would grow the study
                    # by many repeats, and every ask costs time linear in its size.
                    if cfg in measured:
                        self._study.tell(ot, measured[cfg])
                    else:
                        self._study.tell(ot, state=optuna.trial.TrialState.FAIL)
                    near = [c for c in space.neighbours(cfg) if c not in tried]
                    if near:
                        return self._rng.choice(near)
                else:
                    self._pending = (ot, cfg)
                    return cfg
        # The sampler keeps returning known or pruned points (it has converged): rather than
        # let the study grow by thousands of repeats, which slows every later ask, try an
        # untried point at random.
        left = [c for c in space.configs if c not in tried]
        return self._rng.choice(left) if left else None

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "sampler": type(self._study.sampler).__name__ if self._study else None}


# ---------------------------------------------------------------------------- model
def family(c: Config) -> tuple:
    """Which costs a config pays: separate actor processes, env workers, replica
    processes, and the device."""
    return (c.num_actors > 1, c.env_parallel_degree > 1, c.policies_per_actor > 1, c.policy_device)


def config_distance(a: Config, b: Config) -> float:
    """How far apart two configs are, for borrowing a measurement's correction: steps of
    two in each knob, plus a penalty for a different device or process structure."""
    d = 0.0
    for k in ("num_actors", "env_parallel_degree", "policies_per_actor", "policy_batch_size"):
        d += abs(math.log2(getattr(a, k)) - math.log2(getattr(b, k)))
    if a.policy_device != b.policy_device:
        d += 2.0
    for k in ("num_actors", "env_parallel_degree", "policies_per_actor"):
        if (getattr(a, k) > 1) != (getattr(b, k) > 1):  # in-process vs a worker: another cost regime
            d += 1.0
    return d


_FITTED = ("ipc_seconds", "contention", "env_overhead_seconds", "collect_seconds", "actor_collect_seconds",
           "env_worker_collect_seconds", "replica_collect_seconds", "cross_node_seconds", "network_bytes_per_second",
           "loaded_step_factor", "device_share", "post_seconds")
"""The profile's costs :func:`fit_overheads` refits: what the record shows of the fit (the
strategy's ``info()["fitted"]``). ``auturi tune``'s limit line reads ``loaded_step_factor``
from it (:func:`auturi.tuner.api.machine_limit`'s ``loaded_env_steps_per_second``)."""


class ModelStrategy(Strategy):
    """Predict every config with the analytic model, measure the promising few.

    After each measurement the model's unmeasurable costs (IPC, bookkeeping) are refitted
    to all measurements, and the remaining error (log measured/predicted) is spread to
    nearby configs, weighted ``exp(-distance / length)``, so one surprising measurement
    corrects its whole neighbourhood.

    How wrong the model still is, ``s``, is the RMS of those log errors (with a prior of
    ``prior_error`` worth one measurement); a config's uncertainty grows with its distance
    to the nearest measured one, ``u = s * (1 - exp(-d / length))``.

    Proposal order: the untried config with the highest optimistic prediction
    ``prediction * exp(kappa * u)``, while that beats the best measured mean by ``margin``;
    then, for each :func:`family` nothing was measured in, its best-predicted config if
    predicted within ``family_window`` of the best; then untried neighbours, predicted
    within ``refine_window`` of the best, of every config measured within ``leader_band`` of
    the best (hill climbing around the leaders, since noise hides which of them is truly
    best; at most ``max_refine`` trials); then stop.

    Args:
        profile: a :class:`Profile`; default: :func:`profile_executor` on the executor.
        max_trials: cap on this strategy's own proposals.
        margin: how much better than the best measured a prediction must be to be tried.
        refine_window: neighbours predicted within this fraction below the best are tried.
        max_refine: cap on neighbour trials.
        leader_band: configs measured within this fraction of the best are climbed from.
        family_window: unexplored families predicted within this fraction of the best are tried.
        length: distance scale of the correction (in steps of two per knob).
        kappa: optimism: how many ``u`` a prediction is raised by when choosing.
        prior_error: the model's assumed log error before measurements say otherwise.
        profile_kwargs: passed to :func:`profile_executor`.
    """

    name = "model"

    def __init__(self, profile: Profile | None = None, *, max_trials: int = 16, margin: float = 0.0,
                 refine_window: float = 0.4, max_refine: int = 8, leader_band: float = 0.05, length: float = 1.0,
                 kappa: float = 1.5, prior_error: float = 0.25, family_window: float = 0.5,
                 profile_kwargs: dict[str, Any] | None = None):
        super().__init__()
        self.profile = profile
        self.fitted: Profile | None = profile
        self.max_trials, self.margin = max_trials, margin
        self.refine_window, self.max_refine, self.length = refine_window, max_refine, length
        self.kappa, self.prior_error, self.leader_band = kappa, prior_error, leader_band
        self.family_window = family_window
        self.profile_kwargs = profile_kwargs or {}
        self.model_error = prior_error
        self._proposed: list[Config] = []
        self._refined = 0
        self._raw: dict[Config, float] = {}  # the fitted model's predictions
        self._pred: dict[Config, float] = {}  # ... corrected by nearby measurements
        self._ucb: dict[Config, float] = {}  # ... raised by their uncertainty
        self._refreshed: tuple | None = None  # the inputs of the last _refresh (profile, space, its size, measured)

    def prepare(self, space: SearchSpace, executor: Any = None, num_steps: int | None = None,
                seed: int = 0) -> None:
        super().prepare(space, executor, num_steps, seed)
        if self.profile is None:
            if executor is None:
                raise ValueError("ModelStrategy needs a Profile or an executor to profile: "
                                 "ModelStrategy(profile=...) or prepare(space, executor)")
            kw = dict(self.profile_kwargs)
            kw.setdefault("batch_sizes", space.values("policy_batch_size"))
            kw.setdefault("devices", space.values("policy_device"))
            kw.setdefault("cores", space.cores)
            if num_steps:
                kw.setdefault("num_steps", num_steps)  # the model prices each collect's fixed costs
            self.profile = profile_executor(executor, **kw)
        elif num_steps and not getattr(self.profile, "num_steps", 0):
            self.profile = self.profile.replace(num_steps=num_steps)
        self.fitted = self.profile
        self._refresh({})

    def _refresh(self, measured: dict[Config, float]) -> None:
        """Refit the costs, then correct every prediction by nearby measurements. A pure
        function of the profile, the space and ``measured``: with all three as at the last
        refresh it is skipped (a proposal after a trial that measured nothing new, the
        online tuner asking again between collects: a refit of a 16-core space takes ~1 s)."""
        assert self.profile is not None
        space = self._space()
        key = (self.profile, space, len(space.configs), dict(measured))
        last = self._refreshed
        if last is not None and last[0] is key[0] and last[1] is key[1] and last[2:] == key[2:]:
            return
        self._refreshed = key
        self.fitted = fit_overheads(self.profile, measured.items())
        raw = {c: predict(c, self.fitted) for c in space.configs}
        resid = []
        for c, v in measured.items():
            p = predict(c, self.fitted)
            if v > 0 and math.isfinite(v) and p > 0 and math.isfinite(p):
                resid.append((c, math.log(v / p)))
        err = math.sqrt((sum(e * e for _, e in resid) + self.prior_error ** 2) / (len(resid) + 1))
        pred, ucb = {}, {}
        for c, r in raw.items():
            if c in measured:
                pred[c] = ucb[c] = measured[c]
                continue
            w_sum, acc, d_min = 0.5, 0.0, math.inf  # the 0.5 pulls a far-off correction back to the model
            for m, e in resid:
                d = config_distance(c, m)
                w = math.exp(-d / self.length)
                w_sum += w
                acc += w * e
                d_min = min(d_min, d)
            pred[c] = r * math.exp(acc / w_sum)
            u = err * (1.0 - math.exp(-d_min / self.length)) if resid else err
            ucb[c] = pred[c] * math.exp(self.kappa * u)
        self._raw, self._pred, self._ucb, self.model_error = raw, pred, ucb, err

    def predicted(self, config: Config) -> float | None:
        return self._pred.get(config)

    def predictions(self) -> dict[Config, float]:
        """Current corrected predictions (measured configs: their measured mean)."""
        return dict(self._pred)

    def _open(self, history: Sequence[Trial]) -> tuple[dict[Config, float], set[Config], list[Config]] | None:
        """Refit to ``history``; ``(measured, tried, untried)``, or None when no proposal is
        left (none untried, or ``max_trials`` reached)."""
        space = self._space()
        if len(self._proposed) >= self.max_trials:
            return None
        measured = _measured(history)
        self._refresh(measured)
        tried = _tried(history)
        untried = [c for c in space.configs if c not in tried]
        return (measured, tried, untried) if untried else None

    def propose(self, history: Sequence[Trial]) -> Config | None:
        space = self._space()
        opened = self._open(history)
        if opened is None:
            return None
        measured, tried, untried = opened
        if not measured:  # nothing measured yet: trust the model
            return self._take(fewest_passes(max(untried, key=lambda c: self._pred[c]), untried, self._pred))
        best_cfg = max(measured, key=lambda c: measured[c])
        best = measured[best_cfg]
        top = max(untried, key=lambda c: self._ucb[c])
        if self._ucb[top] > best * (1 + self.margin):
            return self._take(top)
        fresh = self.propose_family(history)
        if fresh is not None:
            return self._take(fresh)
        if self._refined < self.max_refine:
            # Hill climb around every config measured within noise of the best (which of
            # them is truly best is not known yet), the best first.
            leaders = sorted((c for c in measured if measured[c] >= best * (1 - self.leader_band)),
                             key=lambda c: -measured[c])
            for lead in leaders:
                near = [c for c in space.neighbours(lead)
                        if c not in tried and self._pred.get(c, 0.0) >= best * (1 - self.refine_window)]
                if near:
                    self._refined += 1
                    return self._take(max(near, key=lambda c: self._pred[c]))
        return None

    def propose_family(self, history: Sequence[Trial]) -> Config | None:
        """The model is most often wrong about a whole family (what a worker process or a
        second actor costs), so: the best-predicted untried config of a :func:`family` nothing
        was measured in, predicted within ``family_window`` of the best measured config; None
        if there is none. Reads the predictions of the last refit (call after :meth:`propose`
        or :meth:`propose_close`); takes nothing (the caller decides whether to try it)."""
        measured = _measured(history)
        if not measured or not self._pred:
            return None
        best = max(measured.values())
        tried, seen = _tried(history), {family(c) for c in measured}
        fresh = [c for c in self._space().configs if c not in tried and family(c) not in seen
                 and self._pred.get(c, 0.0) >= best * (1 - self.family_window)]
        return fewest_passes(max(fresh, key=lambda c: self._pred[c]), fresh, self._pred) if fresh else None

    def propose_close(self, history: Sequence[Trial], max_gap: float = 0.25,
                      key: Callable[[Config, float], float] | None = None) -> Config | None:
        """The online search's rule (each trial there costs training time): among the untried
        configs within the model's error of the best measured one (``prediction >= best *
        exp(-min(model_error, max_gap))``: the prediction cannot separate them from the best),
        the one with the best corrected prediction, or the highest ``key(config, prediction)``
        (the online tuner ranks by what a trial would pay back, which counts what starting
        its processes costs); None once none is left, or at ``max_trials``. A config predicted
        far slower than the best measured one is never proposed."""
        opened = self._open(history)
        if opened is None:
            return None
        measured, _, untried = opened
        if measured:
            floor = max(measured.values()) * math.exp(-min(self.model_error, max_gap))
            untried = [c for c in untried if self._pred[c] >= floor]
            if not untried:
                return None
        rank = (lambda c: key(c, self._pred[c])) if key is not None else (lambda c: self._pred[c])
        return self._take(fewest_passes(max(untried, key=rank), untried, self._pred))

    def _take(self, c: Config) -> Config:
        self._proposed.append(c)
        return c

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "max_trials": self.max_trials, "margin": self.margin,
                "refine_window": self.refine_window, "max_refine": self.max_refine, "kappa": self.kappa,
                "model_error": self.model_error,
                "profile": self.profile.to_dict() if self.profile else None,
                "fitted": {k: getattr(self.fitted, k) for k in _FITTED if hasattr(self.fitted, k)}
                if self.fitted else None}


BATCH_TIE = 0.03
"""Predictions within this fraction of each other do not separate batch sizes (see
:func:`fewest_passes`)."""


def fewest_passes(choice: Config, pool: Sequence[Config], pred: dict[Config, float]) -> Config:
    """``choice``, or the config of ``pool`` that differs from it only by a larger policy
    batch (fewer forward passes per row) and is predicted within :data:`BATCH_TIE` of it:
    the largest such batch. The model's batch-size effects are often smaller than its error
    (it predicted a batch of 1 and of 8 equal for 8 env workers of a 1 ms env, which measured
    1,617 and ~3,800 steps/s: the actor waits in its own env share between passes), and the
    first trial of a layout family that measures 10% below the best ends the family; so a
    close call goes to the fewest passes, the plain lock-step loop."""
    p0 = pred.get(choice, 0.0)
    same = [c for c in pool if c.policy_batch_size > choice.policy_batch_size
            and c.replace(policy_batch_size=choice.policy_batch_size) == choice
            and pred.get(c, 0.0) >= p0 * (1 - BATCH_TIE)]
    return max(same, key=lambda c: c.policy_batch_size) if same else choice


STRATEGIES = {"grid": GridStrategy, "optuna": OptunaStrategy, "model": ModelStrategy}


def make_strategy(strategy: str | Strategy, **kwargs: Any) -> Strategy:
    """A strategy by name (``grid``, ``optuna``, ``model``) or the given instance."""
    if isinstance(strategy, Strategy):
        return strategy
    try:
        cls = STRATEGIES[strategy]
    except (KeyError, TypeError):
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {sorted(STRATEGIES)} "
                         f"or pass a Strategy instance") from None
    return cls(**kwargs)
