"""What the SB3 and RLlib faces share: the tuner's budget argument, the backends a face
accepts and the executor's stuck-worker bound, seed resolution, the assembly of the executor,
the online tuner and the status server (:func:`build_collector`), and the handle base
(:class:`FaceHandle`) a face attaches to what it wraps."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from auturi.config import Config
from auturi.tuner.online_settings import OnlineSettings

FACE_BACKENDS = ("shm", "serial", "ray")
"""Backends ``auturi.wrap`` runs on (``ray``: one Ray actor per actor, on a Ray cluster; see
:mod:`auturi.executor.ray`)."""


def tuner_kwargs(budget: Any) -> dict[str, Any]:
    """The online tuner's keyword arguments from ``wrap(..., budget=)``: ``None`` (the tuner's
    defaults), an int (configs to measure), a float (seconds), an
    :class:`~auturi.tuner.online_settings.OnlineSettings` or a dict of its fields and other
    :class:`~auturi.tuner.OnlineTuner` arguments (checked: a misspelt name is a ``TypeError``
    naming the closest, a value breaking its rule a ``ValueError`` naming the field).

    >>> tuner_kwargs(4), tuner_kwargs(30.0)
    ({'budget_trials': 4}, {'budget_trials': None, 'budget_seconds': 30.0})
    >>> tuner_kwargs({"serch_share": 0.1})
    Traceback (most recent call last):
    ...
    TypeError: tuner_options: 'serch_share' is neither an OnlineSettings field nor an OnlineTuner argument; did you mean 'search_share'?
    """
    if budget is None:
        return {}
    if isinstance(budget, OnlineSettings):
        return budget.to_dict()
    if isinstance(budget, Mapping):
        OnlineSettings.split(budget)  # checks the names and the settings' values
        return dict(budget)
    if isinstance(budget, bool):
        raise TypeError("budget must be None, an int (configs to try), a float (seconds) or a dict")
    if isinstance(budget, int):
        return {"budget_trials": budget}
    if isinstance(budget, float):
        return {"budget_trials": None, "budget_seconds": budget}
    raise TypeError(f"budget must be None, an int (configs to try), a float (seconds), an OnlineSettings or a dict "
                    f"of OnlineTuner arguments, got {budget!r}")


def resolve_budget(budget: Any = None, *, budget_trials: int | None = None, budget_seconds: float | None = None,
                   tuner_options: OnlineSettings | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The online tuner's keyword arguments from ``wrap``'s typed budget: ``budget_trials``
    (configs to measure), ``budget_seconds`` (wall seconds of the search, training included)
    and ``tuner_options``: an :class:`~auturi.tuner.online_settings.OnlineSettings`, or a dict
    of its fields and other :class:`~auturi.tuner.OnlineTuner` arguments (``cache``,
    ``space``, ``callback``, ...), checked as :func:`tuner_kwargs` does. The old ``budget=``
    (int, float or dict) still works, with a ``DeprecationWarning``.

    >>> resolve_budget(budget_trials=4, tuner_options={"search_share": 0.1})
    {'search_share': 0.1, 'budget_trials': 4}
    >>> resolve_budget(budget_seconds=30)
    {'budget_seconds': 30.0}
    """
    import warnings

    out: dict[str, Any] = {}
    if budget is not None:
        warnings.warn("wrap(..., budget=) is deprecated: pass budget_trials= (configs to measure), budget_seconds= "
                      "(seconds) or tuner_options={...} (OnlineTuner arguments)", DeprecationWarning, stacklevel=3)
        out = tuner_kwargs(budget)
    if tuner_options is not None:
        if not isinstance(tuner_options, (Mapping, OnlineSettings)):
            raise TypeError(f"tuner_options must be an OnlineSettings or a dict of OnlineTuner arguments, got "
                            f"{tuner_options!r}")
        out.update(tuner_kwargs(tuner_options))
    if budget_trials is not None:
        if isinstance(budget_trials, bool) or not isinstance(budget_trials, int) or budget_trials < 1:
            raise ValueError(f"budget_trials must be a positive int (configs to measure), got {budget_trials!r}")
        out["budget_trials"] = budget_trials
    if budget_seconds is not None:
        if isinstance(budget_seconds, bool) or not isinstance(budget_seconds, (int, float)) or not budget_seconds > 0:
            raise ValueError(f"budget_seconds must be a positive number of seconds, got {budget_seconds!r}")
        out["budget_seconds"] = float(budget_seconds)
    return out


def check_face_options(backend: Any, worker_timeout: Any, address: Any = None) -> None:
    """Refuse, with the fix, a backend the faces do not run on, an ``address`` without the
    ``ray`` backend, a missing Ray, or a timeout the executor would refuse (checked at wrap
    time: RLlib builds its executor only in ``build_algo()``).

    >>> check_face_options("shm", None, address="auto")
    Traceback (most recent call last):
    ...
    ValueError: address='auto' is the Ray cluster to collect on: it needs backend='ray', got backend='shm'
    """
    import importlib.util

    from auturi.executor.base import resolve_worker_timeout

    if backend not in FACE_BACKENDS:
        raise ValueError(f"backend must be one of {FACE_BACKENDS} for auturi.wrap, got {backend!r}")
    if address is not None and backend != "ray":
        raise ValueError(f"address={address!r} is the Ray cluster to collect on: it needs backend='ray', "
                         f"got backend={backend!r}")
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ImportError('backend="ray" needs Ray, which is not installed: pip install "auturi[ray]" '
                          '(or backend="shm" on one machine)')
    resolve_worker_timeout(worker_timeout)


def ray_kwargs(backend: str, address: str | None, actor_resources: Mapping[str, float] | None = None
               ) -> dict[str, Any]:
    """The ``make_executor`` keywords only the ``ray`` backend takes.

    >>> ray_kwargs("shm", None), ray_kwargs("ray", "auto", {"CPU": 2})
    ({}, {'address': 'auto', 'actor_resources': {'CPU': 2}})
    """
    if backend != "ray":
        return {}
    out: dict[str, Any] = {"address": address}
    if actor_resources:
        out["actor_resources"] = dict(actor_resources)
    return out


def placement_of(executor: Any) -> list[dict[str, Any]] | None:
    """Where each actor runs (the ``ray`` backend's ``actor_places``), or None on one machine."""
    return getattr(executor, "actor_places", None)


def resolve_seed(*candidates: Any) -> int:
    """The first candidate that is not ``None`` (the user's ``seed=``, then what the framework
    holds), else a random one; env ``i`` is seeded ``seed + i``, so it must be >= 0.

    >>> resolve_seed(None, 7, 3)
    7
    """
    seed = next((c for c in candidates if c is not None), None)
    if seed is None:
        seed = int(np.random.randint(0, 2**31 - 1))
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be >= 0 for auturi (env i is seeded seed + i), got {seed}")
    return seed


def remaining_collects(steps_left: int, steps_per_collect: int) -> int | None:
    """Collects still to come after this one when ``steps_left`` env steps remain (``None``:
    unknown). The online tuner moves only where a move pays back within them.

    >>> remaining_collects(100, 10), remaining_collects(0, 10)
    (9, None)
    """
    if steps_left <= 0:
        return None
    return max(0, -(-int(steps_left) // max(1, int(steps_per_collect))) - 1)


@dataclass
class Collector:
    """What a face builds to collect: the executor, the online tuner (``None`` for a fixed
    config) and, with ``status_port``, the status snapshot and server."""

    executor: Any
    tuner: Any = None
    snapshot: Any = None
    server: Any = None


def build_collector(env_fns: Sequence[Any], policy: Any, num_envs: int, *, config: Config | None, tune: bool,
                    strategy: str, budget: Any, backend: str, seed: int, worker_timeout: float | None,
                    workload: Mapping[str, Any], status_port: int | None = None,
                    verbose: bool = False, start: Config | None = None,
                    executor_kwargs: Mapping[str, Any] | None = None) -> Collector:
    """The executor (on ``config``, else ``start``, else the serial layout), the online tuner
    when ``tune`` and no ``config``, and the status server on ``status_port``.
    ``executor_kwargs``: more ``make_executor`` keywords (:func:`ray_kwargs`). On any failure
    everything already started is ended before the error propagates."""
    from auturi.executor import make_executor
    from auturi.tuner import OnlineTuner

    start = config or start or Config.serial(num_envs)
    tkw = tuner_kwargs(budget)
    ekw = dict(executor_kwargs or {})
    if tune and config is None and backend == "shm" and _env_workers_soon(start, num_envs, tkw):
        from auturi.executor.shm.executor import start_env_server_early

        start_env_server_early(list(env_fns), num_envs)
        # The look will most likely move the start's envs to env workers before any collect:
        # they are made where they land, in parallel, not here first (made here only if kept).
        ekw.setdefault("defer_envs", True)
    executor = make_executor(list(env_fns), policy, num_envs=num_envs, config=start, backend=backend, seed=seed,
                             worker_timeout=worker_timeout, **ekw)
    out = Collector(executor)
    try:
        tuned = tune and config is None
        if status_port is not None:
            out.snapshot = _status_snapshot(workload.get("env"))
            if tuned:
                user_cb = tkw.pop("callback", None)
                tkw["callback"] = out.snapshot if user_cb is None else _both(out.snapshot, user_cb)
        if tuned:
            out.tuner = OnlineTuner(executor, strategy=strategy, seed=seed, workload=dict(workload), **tkw)
        if out.snapshot is not None:
            out.server = start_status_server(out.snapshot, out.tuner, start, status_port, verbose)
    except BaseException:
        executor.close()
        raise
    return out


def _env_workers_soon(start: Config, num_envs: int, tuner_kw: Mapping[str, Any]) -> bool:
    """Whether the online tuner built with ``tuner_kw`` will start the env workers' server at
    its wrap-time look (:func:`auturi.tuner.online_begin.warms_env_server_at_begin`, for two
    envs or more). The face then starts it before the executor is built: on the H200 box of 2026-11-27 the start's 32 Pong
    envs were made in the caller and env 0 and the policy profiled (about 9 s of a 15.6 s
    wrap) before the server began its imports, which the move to env workers then waited for."""
    from auturi.resources import usable_cores
    from auturi.tuner.online_begin import warms_env_server_at_begin

    share = tuner_kw.get("early_env_share", OnlineSettings().early_env_share)
    return num_envs >= 2 and warms_env_server_at_begin(start, int(tuner_kw.get("cores") or usable_cores()), share)


def start_status_server(snapshot: Any, tuner: Any, start: Config, port: int, verbose: bool) -> Any:
    """Serve ``snapshot`` on loopback ``port`` (0: a free one), following ``tuner`` or showing
    the fixed ``start`` config."""
    if tuner is not None:
        snapshot.attach(tuner)
        snapshot.refresh()
    else:
        snapshot.update(status={"phase": "locked", "mode": "fixed", "current_config": start.to_dict(), "trials": 0})
    from auturi.server import StatusServer

    server = StatusServer(snapshot, port=int(port))
    url = server.start()
    if verbose:
        print(f"auturi: status at {url}")
    return server


class FaceHandle:
    """What a face attaches to the trained object (``model.auturi``): the executor, the optional
    online tuner, the status server and the last collect's stats. ``close()`` ends the workers
    and the server; it is idempotent."""

    def __init__(self, collector: Collector, seed: int):
        self.executor = collector.executor
        self.tuner = collector.tuner
        self.snapshot = collector.snapshot  # auturi.server.StatusSnapshot, with status_port
        self.server = collector.server      # auturi.server.StatusServer, with status_port
        self.seed = seed
        self.last_stats: Any = None
        self.collects = 0

    @property
    def config(self) -> Config:
        return self.executor.config

    @property
    def actor_places(self) -> list[dict[str, Any]] | None:
        """Where each actor runs (node, ip, pid, envs) on the ``ray`` backend; None on one machine."""
        return placement_of(self.executor)

    def collect_rollout(self, num_steps: int, remaining: int | None = None, measure: bool = True) -> Any:
        """One collect of ``num_steps`` per env, through the tuner when there is one
        (``remaining``: collects still to come in this training run, or ``None``; ``measure``:
        False for a collect unlike the training's, which the tuner must not time)."""
        if self.tuner is not None:
            rollout = self.tuner.collect(num_steps, remaining_collects=remaining, measure=measure)
        else:
            rollout = self.executor.collect(num_steps)
        self.collects += 1
        self.last_stats = rollout.stats
        if self.snapshot is not None:
            if self.tuner is None:
                self.snapshot.update(current_config=self.executor.config.to_dict())
            places = placement_of(self.executor)
            if places is not None:  # the page shows where each actor runs (ray backend)
                self.snapshot.set_placement(places)
            # The page's throughput over time, its reconfigure marks and the time split.
            self.snapshot.record_collect(rollout.stats, self.executor.config)
        return rollout

    def close(self) -> None:
        """End the workers (and the status server). Idempotent."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        self.executor.close()


def _status_snapshot(env: Any = None) -> Any:
    try:
        from auturi.server import StatusSnapshot
    except ImportError as exc:
        raise ImportError(f"status_port needs the status endpoint's dependencies ({exc}): "
                          f"pip install 'auturi[server]', or omit status_port") from exc
    return StatusSnapshot(env=None if env is None else str(env))  # the page names the env


def _both(first: Callable[[Any], None], second: Callable[[Any], None]) -> Callable[[Any], None]:
    def call(event: Any) -> None:
        first(event)
        second(event)

    return call
