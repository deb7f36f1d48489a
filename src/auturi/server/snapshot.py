"""The snapshot the status server serves: the tuner's (or training loop's) thread publishes,
the server's thread reads, with no lock between them."""
import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

HISTORY_POINTS = 1000
"""Collects kept for the page's throughput-over-time plot (the oldest are dropped): bounded so a
long training run neither grows memory nor makes ``/history`` slow to copy."""


@dataclasses.dataclass(frozen=True)
class _State:
    """One published snapshot; replaced whole, never changed (readers take no lock)."""

    status: dict[str, Any]
    trials: tuple[dict[str, Any], ...] = ()
    throughput_now: float | None = None
    throughput_now_at: float | None = None
    updated_at: float = 0.0
    history: tuple[dict[str, Any], ...] = ()
    steps_total: int | None = None
    collects_total: int = 0
    seconds_total: dict[str, float] | None = None  # wall, env, policy, wait: the counters' sums
    time_split: dict[str, Any] | None = None  # the latest collect's split
    placement: tuple[dict[str, Any], ...] | None = None  # where each actor runs (ray backend)


class StatusSnapshot:
    """What the status server serves: the latest status dict and trial list, published by
    the tuning thread and read by the server thread without any lock (each update replaces
    one immutable state; a reader sees the old one or the new one, never half of either).

    Use it as (or inside) the tuner's callback::

        snap = StatusSnapshot()
        tuner = Tuner(callback=snap)
        snap.attach(tuner)          # so trial ends also refresh the trial list
        StatusServer(snap).start()

    ``update(status=..., trials=...)`` publishes by hand (for a training loop or a test).
    A training loop calls :meth:`record_collect` after each collect: the page plots those
    collects over wall time and shows where the latest one's time went, and ``/metrics``
    counts their steps.

    Example:
        >>> from auturi import Config
        >>> from auturi.rollout import CollectStats
        >>> snap = StatusSnapshot(env="CartPole-v1")
        >>> snap.update(status={"phase": "locked", "mode": "fixed"})
        >>> snap.record_collect(CollectStats(steps=512, seconds=0.25, env_seconds=0.15,
        ...                                  policy_seconds=0.08, wait_seconds=0.0), Config.serial(8))
        >>> st = snap.status()
        >>> st["env"], st["throughput_now"], st["steps_total"], st["time_split"]["env_seconds"]
        ('CartPole-v1', 2048.0, 512, 0.15)
        >>> len(snap.history())
        1
    """

    def __init__(self, source: Any = None, hardware: Mapping[str, Any] | None = None, *, env: str | None = None):
        self._source = source
        self._hardware = dict(hardware) if hardware else None
        self._env = env
        self._state = _State(status={"phase": "idle"}, updated_at=time.time())

    def attach(self, source: Any) -> "StatusSnapshot":
        """Refresh trials from ``source.trials()`` on trial ends (and take its ``hardware``)."""
        self._source = source
        return self

    # -- publishing (the tuner's or the training loop's thread)
    def update(self, status: Mapping[str, Any] | None = None, trials: Sequence[Mapping[str, Any]] | None = None,
               throughput_now: float | None = None, **status_fields: Any) -> None:
        """Publish a new snapshot; omitted parts keep their previous value. Keyword fields
        are merged into the status (``update(phase="failed")``)."""
        old = self._state
        st = dict(old.status if status is None else status)
        st.update(status_fields)
        tr = old.trials if trials is None else tuple(dict(t) for t in trials)
        now = time.time()
        now_v, now_t = old.throughput_now, old.throughput_now_at
        if throughput_now is not None:
            now_v, now_t = float(throughput_now), now
        self._state = dataclasses.replace(old, status=st, trials=tr, throughput_now=now_v, throughput_now_at=now_t,
                                          updated_at=now)

    def record_collect(self, stats: Any, config: Any = None, *, at: float | None = None) -> None:
        """Publish one training collect: ``stats`` is its :class:`~auturi.rollout.CollectStats`
        (or a dict of the same fields), ``config`` the layout it ran under (default: the status's
        current config, else its best). Sets the throughput now, adds a point to the history
        (reconfigures show as config changes between points) and the steps to the counter.
        ``at`` is the wall time (``time.time()``) the collect ended; default now."""
        get = stats.get if isinstance(stats, Mapping) else (lambda k, d=None: getattr(stats, k, d))
        steps, seconds = _num(get("steps")), _num(get("seconds"))
        if steps is None or seconds is None or seconds <= 0:
            return  # nothing measurable: an empty collect moves no counter
        old = self._state
        if config is None:
            config = old.status.get("current_config") or old.status.get("best_config")
        cfg = config.to_dict() if hasattr(config, "to_dict") else (dict(config) if isinstance(config, Mapping) else None)
        now = time.time() if at is None else float(at)
        parts = {k: _num(get(k)) or 0.0 for k in ("env_seconds", "policy_seconds", "wait_seconds")}
        point = {"at": now, "steps": int(steps), "seconds": seconds, "steps_per_second": steps / seconds,
                 "config": cfg, **parts}
        totals = dict(old.seconds_total or {"wall": 0.0, "env_seconds": 0.0, "policy_seconds": 0.0, "wait_seconds": 0.0})
        totals["wall"] += seconds
        for k, v in parts.items():
            totals[k] += v
        self._state = dataclasses.replace(
            old, throughput_now=point["steps_per_second"], throughput_now_at=now, updated_at=now,
            history=(old.history + (point,))[-HISTORY_POINTS:], steps_total=(old.steps_total or 0) + int(steps),
            collects_total=old.collects_total + 1, seconds_total=totals, time_split=point)

    def set_placement(self, places: Sequence[Mapping[str, Any]] | None) -> None:
        """Publish where each actor runs (the ``ray`` backend's ``actor_places``: actor, envs,
        node, ip, pid); the status shows it as ``actors`` until the next call."""
        value = None if places is None else tuple(dict(p) for p in places)
        if value != self._state.placement:
            self._state = dataclasses.replace(self._state, placement=value, updated_at=time.time())

    def __call__(self, event: Any) -> None:
        """A tuner callback: takes the status each :class:`~auturi.tuner.TunerEvent` carries,
        the latest sample as the throughput now, and the trial list at trial ends."""
        kind = getattr(event, "kind", "")
        trials = None
        if kind in ("trial_end", "choice", "done", "locked", "phase") and self._source is not None:
            try:
                trials = self._source.trials()
            except Exception:  # noqa: BLE001 - a status feed must never break tuning
                trials = None
        value = getattr(event, "value", None)
        self.update(status=getattr(event, "status", None) or None, trials=trials,
                    throughput_now=value if kind == "sample" and value is not None else None)

    def refresh(self) -> None:
        """Pull ``status()`` and ``trials()`` from the attached source now (call it from the
        thread that owns the source, e.g. between training collects)."""
        if self._source is not None:
            self.update(status=self._source.status(), trials=self._source.trials())

    # -- reading (any thread)
    @property
    def hardware(self) -> dict[str, Any] | None:
        hw = getattr(self._source, "hardware", None)
        return dict(hw) if hw else self._hardware

    def status(self) -> dict[str, Any]:
        s = self._state
        out = dict(s.status)
        if s.throughput_now is not None:
            out.setdefault("throughput_now", s.throughput_now)
            out.setdefault("throughput_now_at", s.throughput_now_at)
        out.setdefault("updated_at", s.updated_at)
        env = self._env or (getattr(self._source, "workload", None) or {}).get("env")
        if env and not out.get("env"):
            out["env"] = env
        if s.placement is not None:
            out.setdefault("actors", [dict(p) for p in s.placement])
        if s.collects_total:
            out.setdefault("steps_total", s.steps_total)
            out.setdefault("collects_total", s.collects_total)
            out.setdefault("seconds_total", dict(s.seconds_total or {}))
            out.setdefault("time_split", dict(s.time_split or {}))
        return out

    def trials(self) -> Sequence[dict[str, Any]]:
        """The latest trial list: the same (immutable) tuple until the next update, so a
        reader may cache what it derives from it."""
        return self._state.trials

    def history(self) -> Sequence[dict[str, Any]]:
        """The recorded collects, oldest first (at most :data:`HISTORY_POINTS`): the same
        tuple until the next :meth:`record_collect`."""
        return self._state.history


def _num(x: Any) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None
