"""The online tuner's moves (:class:`Moves`): what moving the training to another layout
would cost and save, getting the executor ready for it, making it, and the run's record of
where the training ran and of the moves made and declined (:meth:`Moves.first_run_cost`).

The phase machine (:class:`~auturi.tuner.OnlineTuner`) decides *when* a move is considered
(which trial is next, when to lock in); this object says what one is *worth*, by the payback
rule (:mod:`auturi.tuner.payback`) applied to this run's measurements, and talks to the
executor through its contract only (:class:`~auturi.executor.contract.ExecutorLike`:
``move_cost``, ``prepare``, ``warming``, ``reconfigure``, ``last_reconfigure``).

Example (an executor of one's own gets the contract's defaults: nothing to warm up):
    >>> from auturi import Config
    >>> from auturi.executor.contract import as_executor_like
    >>> from auturi.tuner.online_settings import OnlineSettings
    >>> class Mine:
    ...     num_envs, config = 8, Config.serial(8)
    ...     def collect(self, num_steps): ...
    ...     def reconfigure(self, config): return 0.2
    >>> moves = Moves(as_executor_like(Mine()), OnlineSettings())
    >>> degree = Config(envs_per_actor=8, env_parallel_degree=4)
    >>> moves.started(degree), moves.must_wait(degree), round(moves.estimate(degree), 2)
    (3, False, 0.48)
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from auturi.config import Config
from auturi.executor.contract import ExecutorLike, MoveCost
from auturi.tuner import payback
from auturi.tuner.measure import Trial
from auturi.tuner.online_settings import OnlineSettings


class Standing(NamedTuple):
    """Where the run stands when a move is weighed (the phase machine's part of the inputs)."""

    best: float | None
    """The best measured config's steps/s (None: nothing measured yet)."""
    left: int | None
    """Collects the training makes after this one (None: unknown)."""
    collect_steps: int
    """Env steps per collect (steps per env times envs)."""
    warmup: int
    """Collects a trial is expected to discard."""
    discount: float
    """The share of a predicted gain a trial is expected to deliver (:func:`payback.discount`)."""
    at_collect: int
    """Collects so far (for the record)."""


class Moves:
    """One run's moves on ``executor`` under ``settings`` (see the module docstring).

    ``reconfigures``: one entry per reconfigure made (``to``, ``at_collect``, ``seconds``, the
    executor's report under ``executor``, ``cold`` when it also started a server);
    ``declined``: the moves not tried because they would not pay back (what a longer run
    re-reads, :func:`~auturi.tuner.payback.declined_now_paying`); ``realized``: per search
    trial, the share of its predicted gain it delivered; ``trial_cost``: what the search
    trials cost (their reconfigures and their collects' time beyond the best config's rate),
    over ``search_trials`` of them; the collects run under each config are kept as totals (an
    off-policy run makes millions of collects)."""

    def __init__(self, executor: ExecutorLike, settings: OnlineSettings):
        self.executor, self.settings = executor, settings
        self.reconfigures: list[dict[str, Any]] = []
        self.declined: list[dict[str, Any]] = []
        self.realized: list[float] = []
        self.trial_cost = 0.0
        self.search_trials = 0
        self.cores: int | None = None  # the machine's usable cores, once the tuner knows its space
        self._costs: dict[tuple[Config, Config], MoveCost] = {}  # see move_cost
        self._promised: dict[Config, tuple[float, float]] = {}  # proposed config -> (predicted gain, best then)
        self.log: dict[Config, list] = {}  # config -> [collects, seconds, steps] run under it

    # -- where the training ran
    def log_collect(self, config: Config, seconds: float, steps: int) -> None:
        """Count one collect, measured or not, under ``config``."""
        tot = self.log.setdefault(config, [0, 0.0, 0])
        tot[0] += 1
        tot[1] += seconds
        tot[2] += steps

    def first_run_cost(self, choice: Trial | None, locked_at: int | None) -> dict[str, Any]:
        """What the run spent off ``choice`` (the locked config, or the best so far):
        ``collects_off_choice``, ``seconds_off_choice`` (for each such collect, its time minus
        what the choice's measured rate would have taken: an estimate, negative when those
        collects happened to be faster), ``reconfigure_seconds`` (every reconfigure), and the
        totals they compare with; ``collects_to_lock``: ``locked_at``."""
        reconf = sum(r["seconds"] for r in self.reconfigures)
        out: dict[str, Any] = {"collects": sum(t[0] for t in self.log.values()),
                               "collect_seconds": sum(t[1] for t in self.log.values()),
                               "reconfigure_seconds": reconf, "reconfigures": len(self.reconfigures),
                               "collects_to_lock": locked_at, "collects_off_choice": None, "seconds_off_choice": None}
        if choice is not None and choice.estimate > 0 and math.isfinite(choice.estimate):
            off = [t for c, t in self.log.items() if c != choice.config]
            out["collects_off_choice"] = sum(t[0] for t in off)
            out["seconds_off_choice"] = sum(t[1] - t[2] / choice.estimate for t in off)
        return out

    # -- the executor's side of a move
    def move_cost(self, config: Config, origin: Config | None = None) -> MoveCost:
        """The executor's ``move_cost``, kept until this object next reconfigures or prepares
        it (what else changes the answer): ranking a 16-core space's 471 configs by payback
        asked it ~1,400 times (plans and their diffs), 1.2 s of a loaded 2-core machine's
        training before the first move."""
        key = (self.executor.config if origin is None else origin, config)
        cost = self._costs.get(key)
        if cost is None:
            cost = self._costs[key] = self.executor.move_cost(config, origin)
        return cost

    def started(self, config: Config, origin: Config | None = None) -> int:
        """Processes a reconfigure from ``origin`` (default: the current layout) to ``config`` starts."""
        return self.move_cost(config, origin).processes

    def cold(self, config: Config) -> bool:
        """Whether a move to ``config`` starts processes forking from a server not serving yet."""
        return self.move_cost(config).cold_servers > 0

    def must_wait(self, config: Config) -> bool:
        """Before a move to ``config`` whose processes fork from a server not serving yet:
        ``prepare`` the executor for it, and say whether the move must wait until it is ready
        (``warming``), the training collecting on the current layout meanwhile. Started any
        earlier, a server's imports slowed every run, also those where no other layout pays
        back (cheap envs: 3-5% of a short run); started inside the reconfigure, they stalled
        the training for their whole length."""
        cost = self.move_cost(config)
        if not (cost.processes and cost.cold_servers):
            return False
        self._costs.clear()
        self.executor.prepare(config)
        return bool(self.executor.warming)

    def warm_ahead(self) -> bool:
        """Prepare the executor for a layout of env workers when such a move has a server to
        start (two envs or more); True when something was started. Called during collects
        nobody times (``OnlineSettings.warm_ahead_seconds``); an optimisation only: on any
        error the trial that needs the server starts it, and says why not."""
        n = self.executor.num_envs
        if n < 2:
            return False
        env_workers = Config(num_actors=1, envs_per_actor=n, env_parallel_degree=n)  # valid for every n >= 2
        try:
            if not self.cold(env_workers):
                return False
            self._costs.clear()
            self.executor.prepare(env_workers)
        except Exception:
            return False
        return True

    def reconfigure(self, config: Config, at_collect: int) -> tuple[float, dict[str, Any] | None]:
        """Move the executor to ``config`` and log it; returns its seconds and the executor's
        report of what it kept and started (``last_reconfigure``), if any."""
        move = self.move_cost(config)
        cold = bool(move.processes and move.cold_servers)  # its processes' servers start inside this reconfigure
        self._costs.clear()
        secs = float(self.executor.reconfigure(config) or 0.0)
        info = self.executor.last_reconfigure
        info = dict(info) if isinstance(info, Mapping) else None
        if info is not None and not secs:
            secs = float(info.get("seconds") or 0.0)
        self.reconfigures.append({"to": config.to_dict(), "at_collect": at_collect, "seconds": secs,
                                  **({"executor": info} if info else {}), **({"cold": True} if cold else {}),
                                  **({"devices": move.devices} if move.devices else {})})
        return secs, info

    # -- what a move is worth
    def estimate(self, config: Config, started: int | None = None, origin: Config | None = None) -> float:
        """Seconds a reconfigure from ``origin`` (default: the current layout) to ``config``
        should take, from this run's reconfigures: its processes (``started``; default: as its
        ``move_cost`` says) and the CUDA devices they initialise, sharing ``self.cores``."""
        move = self.move_cost(config, origin)
        started = move.processes if started is None else started
        return payback.reconfigure_estimate(self.reconfigures, started, move.devices, self.cores)

    def payback(self, config: Config, pred: float | None, st: Standing) -> tuple[float, float] | None:
        """``(benefit, cost)`` in seconds of trying ``config`` predicted at ``pred`` steps/s
        (:func:`payback.payback`); None when it cannot be told (the collects left, the best
        measured figure or the prediction unknown)."""
        if st.left is None or not st.best or not pred or not math.isfinite(pred):
            return None
        per = self._per_collect(pred, st)
        if not per:
            return 0.0, 0.0  # within noise: no benefit to weigh (declined: benefit must be > 0)
        here = self.executor.config
        move = self.move_cost(config)
        return payback.payback(
            left=st.left, per_collect=per, warmup_collects=st.warmup, collect_seconds=st.collect_steps / st.best,
            there_seconds=self.estimate(config, move.processes),
            back_seconds=self.estimate(here, origin=config),
            server_start=bool(move.processes and move.cold_servers),
            search_trials=self.search_trials, trial_cost=self.trial_cost)

    def net(self, config: Config, pred: float, st: Standing) -> float:
        """How the online search ranks the configs it may try: benefit minus cost of trying
        ``config`` predicted at ``pred`` (:meth:`payback`), or the prediction itself when that
        cannot be told."""
        bc = self.payback(config, pred, st)
        return pred if bc is None else bc[0] - bc[1]

    def refuse(self, config: Config, pred: float | None, st: Standing, *, factor: float = 1.0,
               unknown_pays: bool = True) -> str | None:
        """None when trying ``config`` pays back ``factor`` times over (or, with
        ``unknown_pays``, when that cannot be told); else the move goes on record in
        ``declined`` and the line that says so is returned."""
        bc = self.payback(config, pred, st)
        if (bc is None and unknown_pays) or (bc is not None and payback.pays_back(*bc, factor=factor)):
            return None
        benefit, cost = bc if bc is not None else (math.nan, math.nan)
        self.declined.append({"config": config.to_dict(), "at_collect": st.at_collect, "collects_left": st.left,
                              "predicted": pred, "best": st.best, "benefit_seconds": benefit, "cost_seconds": cost,
                              "benefit_per_collect": self._per_collect(pred, st)})
        return (f"not trying {config}: {st.left} collects left; it would save ~{benefit:.2f} s against "
                f"~{cost:.2f} s to try it")

    def _per_collect(self, pred: float | None, st: Standing) -> float:
        return payback.benefit_per_collect(pred, st.best, collect_steps=st.collect_steps, discount=st.discount,
                                           min_gain=self.settings.min_gain)

    # -- how well the promises held
    def promise(self, config: Config, pred: float | None, best: float | None) -> None:
        """Note the gain a search trial of ``config`` is tried for (over ``best`` steps/s)."""
        if best and pred:
            self._promised[config] = (1.0 - best / pred, best)

    def track(self, trial: Trial) -> None:
        """After a search trial: count it, and what fraction of its predicted gain it delivered."""
        self.search_trials += 1
        promised = self._promised.pop(trial.config, None)
        if promised is None or promised[0] <= 0:
            return
        gain, best_then = promised
        self.realized.append(payback.realized_fraction(gain, best_then, trial.estimate if trial.ok else None))
