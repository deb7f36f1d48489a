"""The snapshot the status server serves: the tuner's (or training loop's) thread publishes,
the server's thread reads, with no lock between them."""
import time
from collections.abc import Mapping, Sequence
from typing import Any


class StatusSnapshot:
    """What the status server serves: the latest status dict and trial list, published by
    the tuning thread and read by the server thread without any lock (each update replaces
    one immutable tuple; a reader sees the old one or the new one, never half of either).

    Use it as (or inside) the tuner's callback::

        snap = StatusSnapshot()
        tuner = Tuner(callback=snap)
        snap.attach(tuner)          # so trial ends also refresh the trial list
        StatusServer(snap).start()

    ``update(status=..., trials=...)`` publishes by hand (for a training loop or a test).
    """

    def __init__(self, source: Any = None, hardware: Mapping[str, Any] | None = None):
        self._source = source
        self._hardware = dict(hardware) if hardware else None
        now = time.time()
        # (status, trials, throughput_now, throughput_now_at, updated_at)
        self._state: tuple[dict[str, Any], tuple[dict[str, Any], ...], float | None, float | None, float] = (
            {"phase": "idle"}, (), None, None, now)

    def attach(self, source: Any) -> "StatusSnapshot":
        """Refresh trials from ``source.trials()`` on trial ends (and take its ``hardware``)."""
        self._source = source
        return self

    # -- publishing (the tuner's thread)
    def update(self, status: Mapping[str, Any] | None = None, trials: Sequence[Mapping[str, Any]] | None = None,
               throughput_now: float | None = None, **status_fields: Any) -> None:
        """Publish a new snapshot; omitted parts keep their previous value. Keyword fields
        are merged into the status (``update(phase="failed")``)."""
        old_status, old_trials, now_v, now_t, _ = self._state
        st = dict(old_status if status is None else status)
        st.update(status_fields)
        tr = old_trials if trials is None else tuple(dict(t) for t in trials)
        if throughput_now is not None:
            now_v, now_t = float(throughput_now), time.time()
        self._state = (st, tr, now_v, now_t, time.time())

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
        st, _, now_v, now_t, updated = self._state
        out = dict(st)
        if now_v is not None:
            out.setdefault("throughput_now", now_v)
            out.setdefault("throughput_now_at", now_t)
        out.setdefault("updated_at", updated)
        return out

    def trials(self) -> Sequence[dict[str, Any]]:
        """The latest trial list: the same (immutable) tuple until the next update, so a
        reader may cache what it derives from it."""
        return self._state[1]
