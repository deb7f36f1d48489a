"""The executor contract's second half, written down: what a tuner may ask of an executor.

The faces' half is :class:`~auturi.executor.base.Executor`'s ``collect``, ``reconfigure``,
``set_policy_state`` and ``close``. A tuner also needs, before it moves the training to
another layout, to know what the move would start and cost (:class:`MoveCost`) and to get
the executor ready for it ahead of time (``prepare``: start in the background what the
reconfigure would otherwise wait for, ``warming`` while that runs). :class:`ExecutorLike`
lists exactly what the tuners use, as SB3's ``VecEnv`` and EnvPool declare theirs; every
backend answers it (``Executor`` gives the defaults, a backend with more to say overrides
its hooks), and an executor of one's own, or a test double, that answers only part of it
gets the defaults for the rest from :func:`as_executor_like`.

Example:
    >>> from auturi import Config
    >>> cost = planned_move_cost(Config.serial(8), Config(envs_per_actor=8, env_parallel_degree=4))
    >>> cost.processes, cost.cold_servers, cost.devices
    (3, 0, 0)
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from auturi.config import Config
from auturi.executor.layout import LayoutPlan, ProcessPlan, plan_layout


@dataclass(frozen=True)
class MoveCost:
    """What a reconfigure from one layout to another would start (from the layout plans' diff,
    :meth:`~auturi.executor.layout.LayoutPlan.diff`): what the tuner prices a move by."""

    processes: int = 0
    """Worker processes it starts: those of the new plan with no live counterpart (kept
    processes, and the caller's own, start nothing)."""
    cold_servers: int = 0
    """Servers those processes fork from that do not serve yet (``shm``: the env workers'
    forkserver, whose imports take a fraction of a second of a core, and the policy
    processes', torch's, seconds): ``prepare`` starts them ahead; unprepared, the
    reconfigure waits for them."""
    devices: int = 0
    """Processes that initialise a CUDA device for it (a started CUDA replica or actor, or the
    caller when its own policy moves to a GPU): each makes a CUDA context."""

    @property
    def free(self) -> bool:
        """True when the move starts nothing (a batch change, fewer processes, the same config)."""
        return not (self.processes or self.cold_servers or self.devices)


def started_devices(started: tuple[ProcessPlan, ...], old: LayoutPlan, new: LayoutPlan) -> int:
    """How many of ``started`` run a policy on a CUDA device, plus one when the caller's own
    policy moves to a CUDA device it did not use (each initialises a CUDA context)."""
    n = sum(1 for p in started if p.device is not None and p.device != "cpu")
    main_old, main_new = old.main.device, new.main.device
    if main_new is not None and main_new != "cpu" and main_new != main_old:
        n += 1
    return n


def planned_move_cost(origin: Config, config: Config, cold_servers: int = 0) -> MoveCost:
    """The move from ``origin`` to ``config`` by the ``shm`` plans' diff (what a backend that
    starts the plan's processes on this machine starts); ``cold_servers`` as the backend says."""
    if origin == config:
        return MoveCost()
    old, new = plan_layout(origin), plan_layout(config)
    started = old.diff(new).started
    return MoveCost(len(started), cold_servers if started else 0, started_devices(started, old, new))


@runtime_checkable
class ExecutorLike(Protocol):
    """Exactly what the tuners (:class:`~auturi.tuner.Tuner`, :class:`~auturi.tuner.OnlineTuner`)
    use of an executor. Besides these, the profile and the cache's workload key read, where an
    executor has them, ``env_fns``, ``policy``, ``seed``, ``spec``, ``backend`` and
    ``last_num_steps`` (describing the workload; a test double may leave them out).

    The faces' half:

    - ``num_envs``, ``config``: the fixed total of envs and the current layout;
    - ``collect(num_steps)``: one collect (a :class:`~auturi.Rollout`, its ``stats`` timed);
    - ``reconfigure(config)``: move to ``config``, returning its seconds; ``last_reconfigure``
      then reports ``{"seconds", "kept", "started", "ended", "moved", "recreated"}`` (None
      where the executor does not say).

    The tuner's half:

    - ``move_cost(config, origin=None)``: what a reconfigure from ``origin`` (default: the
      current layout) to ``config`` would start (:class:`MoveCost`); cheap, starts nothing;
    - ``prepare(config)``: start in the background what that reconfigure would wait for
      (never changes the layout or any collect's data); idempotent;
    - ``warming``: True while what ``prepare`` started is still starting (it shares the
      cores: a collect timed meanwhile reads slow).
    """

    num_envs: int
    last_reconfigure: Mapping[str, float] | None

    @property
    def config(self) -> Config: ...

    def collect(self, num_steps: int) -> Any: ...

    def reconfigure(self, config: Config) -> float: ...

    def move_cost(self, config: Config, origin: Config | None = None) -> MoveCost: ...

    def prepare(self, config: Config) -> None: ...

    @property
    def warming(self) -> bool: ...


def as_executor_like(executor: Any) -> ExecutorLike:
    """``executor`` itself when it answers the whole contract (every backend does), else a view
    of it that adds the defaults for what it leaves out: ``move_cost`` from the plans' diff,
    ``prepare`` doing nothing, ``warming`` False, ``last_reconfigure`` None. It must have
    ``config``, ``num_envs``, ``collect`` and ``reconfigure`` (``TypeError`` otherwise).

    >>> class Mine:   # an executor of one's own: the faces' half only
    ...     num_envs, config = 2, Config.serial(2)
    ...     def collect(self, num_steps): ...
    ...     def reconfigure(self, config): return 0.0
    >>> ex = as_executor_like(Mine())
    >>> isinstance(ex, ExecutorLike), ex.warming, ex.move_cost(Config(num_actors=2)).processes
    (True, False, 2)
    """
    if isinstance(executor, ExecutorLike):
        return executor
    missing = [m for m in ("config", "num_envs", "collect", "reconfigure") if not hasattr(executor, m)]
    if missing:
        raise TypeError(f"{type(executor).__name__} is not an executor: it lacks {', '.join(missing)} (make one "
                        f"with auturi.make_executor, or subclass auturi.executor.Executor)")
    return _WithDefaults(executor)


class _WithDefaults:
    """An executor that answers part of the contract, completed with the defaults (see
    :func:`as_executor_like`); every other attribute is the executor's own."""

    def __init__(self, inner: Any):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def config(self) -> Config:
        return self._inner.config

    @property
    def num_envs(self) -> int:
        return self._inner.num_envs

    def collect(self, num_steps: int) -> Any:
        return self._inner.collect(num_steps)

    def reconfigure(self, config: Config) -> float:
        return self._inner.reconfigure(config)

    @property
    def last_reconfigure(self) -> Mapping[str, float] | None:
        return getattr(self._inner, "last_reconfigure", None)

    def move_cost(self, config: Config, origin: Config | None = None) -> MoveCost:
        own = getattr(self._inner, "move_cost", None)
        if own is not None:
            return own(config, origin)
        try:
            return planned_move_cost(self._inner.config if origin is None else origin, config)
        except Exception:  # a config the planner refuses (a test double's): count one process
            return MoveCost(processes=1)

    def prepare(self, config: Config) -> None:
        own = getattr(self._inner, "prepare", None)
        if own is not None:
            own(config)

    @property
    def warming(self) -> bool:
        return bool(getattr(self._inner, "warming", False))
