"""What a source reports, shaped into what the endpoints return: finite numbers, validated
configs, JSON-safe values. Nothing here raises on odd input: a status feed must never fail a
request because the source reported something unexpected."""
import functools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

SEARCH_PHASES = frozenset({"baseline", "profiling", "search", "final", "confirm", "explore", "research"})
"""Phases in which the tuner is still measuring, so its budget is worth showing."""


def _finite(x: Any) -> float | None:
    """A finite float, or None (JSON has no inf/nan; bools are not numbers here)."""
    if isinstance(x, bool) or x is None:
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _int(x: Any, default: int | None = 0) -> int | None:
    f = _finite(x)
    return int(f) if f is not None else default


def _jsonable(x: Any, depth: int = 0) -> Any:
    """Anything, made JSON-safe: non-finite floats become None, unknown objects their str."""
    if depth > 20:
        return None
    if x is None or isinstance(x, (bool, str, int)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v, depth + 1) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_jsonable(v, depth + 1) for v in x]
    if hasattr(x, "to_dict"):
        try:
            return _jsonable(x.to_dict(), depth + 1)
        except Exception:  # noqa: BLE001
            return str(x)
    f = _finite(x) if hasattr(x, "__float__") else None
    return f if f is not None else str(x)


def _config_dict(c: Any) -> dict[str, Any] | None:
    """A Config (or its dict) as a validated knob dict, or None."""
    parsed = _parse_config(c)
    return dict(parsed[0]) if parsed else None


def _config_label(c: Any) -> str:
    parsed = _parse_config(c)
    return parsed[1] if parsed else ""


def _config_code(cfg: dict[str, Any] | None) -> str:
    """The line that reproduces ``cfg`` in Python (``auturi.Config(num_actors=2, ...)``), or ""."""
    from auturi.config import Config

    return "" if cfg is None else "auturi." + repr(Config.from_dict(cfg))


def _collect_fields(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The recorded collects' counters and the latest collect's time split, or None each."""
    totals, split = raw.get("seconds_total"), raw.get("time_split")
    parts = ("seconds", "env_seconds", "policy_seconds", "wait_seconds")
    return {
        "steps_total": _int(raw.get("steps_total"), None), "collects_total": _int(raw.get("collects_total"), None),
        "seconds_total": ({k: _finite(totals.get(k)) for k in ("wall", *parts[1:])}
                          if isinstance(totals, Mapping) else None),
        "time_split": ({**{k: _finite(split.get(k)) for k in parts}, "label": _config_label(split.get("config"))}
                       if isinstance(split, Mapping) else None),
        "actors": _actor_places(raw.get("actors")),
    }


def _actor_places(places: Any) -> list[dict[str, Any]] | None:
    """Where each actor runs (ray backend), checked field by field; None when not reported."""
    if not isinstance(places, (list, tuple)):
        return None
    out = []
    for p in places:
        if isinstance(p, Mapping):
            envs = p.get("envs")
            out.append({"actor": _int(p.get("actor")), "node": str(p.get("node", "?")), "ip": str(p.get("ip", "")),
                        "pid": _int(p.get("pid")),
                        "envs": [_int(e) for e in envs] if isinstance(envs, (list, tuple)) else []})
    return out


def _parse_config(c: Any) -> tuple[dict[str, Any], str] | None:
    from auturi.config import Config

    if c is None:
        return None
    if isinstance(c, Config):
        return c.to_dict(), str(c)
    try:
        key = tuple(sorted(dict(c).items()))
        hash(key)
    except Exception:  # noqa: BLE001 - not a mapping of hashable values
        return None
    return _parse_config_key(key)


@functools.lru_cache(maxsize=4096)
def _parse_config_key(key: tuple) -> tuple[dict[str, Any], str] | None:
    from auturi.config import Config

    try:
        cfg = Config.from_dict(dict(key))
    except Exception:  # noqa: BLE001 - a malformed config from a source is shown as unknown
        return None
    return cfg.to_dict(), str(cfg)



class _Reader:
    """Reads the source and shapes what the endpoints return; never raises."""

    def __init__(self, source: Any, hardware: dict[str, Any] | None):
        self.source = source
        self.hardware = hardware or {}
        self.started = time.time()
        self._cache: tuple[Any, list[dict[str, Any]]] | None = None

    def raw_status(self) -> dict[str, Any]:
        for _ in range(3):  # a raw tuner may mutate a list while we read it: retry
            try:
                st = self.source.status()
                return dict(st) if isinstance(st, Mapping) else {"phase": "unknown"}
            except Exception:  # noqa: BLE001
                time.sleep(0.001)
        return {"phase": "unknown", "error": "the source's status() failed"}

    def raw_trials(self) -> Sequence[Any]:
        for _ in range(3):
            try:
                tr = self.source.trials()
                return tr if isinstance(tr, tuple) else (list(tr) if tr is not None else [])
            except Exception:  # noqa: BLE001
                time.sleep(0.001)
        return []

    def status(self) -> dict[str, Any]:
        raw = self.raw_status()
        now = time.time()
        known = {"phase", "mode", "strategy", "current_config", "current_samples", "best_config", "best_throughput",
                 "best_half_width", "best_low", "best_high", "best_confidence", "throughput_now", "throughput_now_at",
                 "trials", "trials_ok", "budget_trials",
                 "budget_trials_left", "budget_seconds", "budget_seconds_left", "elapsed_seconds", "space",
                 "cache_hit", "updated_at", "hardware", "env", "steps_total", "collects_total", "seconds_total",
                 "time_split", "actors"}
        cur, best = _config_dict(raw.get("current_config")), _config_dict(raw.get("best_config"))
        now_at, updated = _finite(raw.get("throughput_now_at")), _finite(raw.get("updated_at"))
        hw = raw.get("hardware")
        if not isinstance(hw, Mapping):
            hw = getattr(self.source, "hardware", None)
        if not isinstance(hw, Mapping) or not hw:
            hw = self.hardware
        space = raw.get("space")
        return {
            "phase": str(raw.get("phase") or "unknown"),
            "mode": None if raw.get("mode") is None else str(raw.get("mode")),
            "strategy": None if raw.get("strategy") is None else str(raw.get("strategy")),
            "current_config": cur, "current_config_label": _config_label(cur),
            "current_samples": _int(raw.get("current_samples")),
            "best_config": best, "best_config_label": _config_label(best),
            "best_throughput": _finite(raw.get("best_throughput")),
            "best_half_width": _finite(raw.get("best_half_width")),
            "best_low": _finite(raw.get("best_low")), "best_high": _finite(raw.get("best_high")),
            "best_confidence": _finite(raw.get("best_confidence")),
            "throughput_now": _finite(raw.get("throughput_now")),
            "throughput_now_age_seconds": None if now_at is None else max(0.0, now - now_at),
            "trials_done": _int(raw.get("trials")), "trials_ok": _int(raw.get("trials_ok")),
            "budget": {"trials": _int(raw.get("budget_trials"), None),
                       "trials_left": _int(raw.get("budget_trials_left"), None),
                       "seconds": _finite(raw.get("budget_seconds")),
                       "seconds_left": _finite(raw.get("budget_seconds_left"))},
            "elapsed_seconds": _finite(raw.get("elapsed_seconds")),
            "cache_hit": raw.get("cache_hit") if isinstance(raw.get("cache_hit"), bool) else None,
            "space": _jsonable(space) if isinstance(space, Mapping) else None,
            "hardware": _jsonable(hw),
            "extra": _jsonable({k: v for k, v in raw.items() if k not in known}),
            "snapshot_age_seconds": None if updated is None else max(0.0, now - updated),
            "server_time": now,
            **self._situation(raw, best),
            **_collect_fields(raw),
        }

    def _situation(self, raw: Mapping[str, Any], best: dict[str, Any] | None) -> dict[str, Any]:
        """What the page needs to pick its view: which run this is, whether the search (and so
        its budget) is still going, the env, and the choice as the line to paste."""
        mode, phase = raw.get("mode"), str(raw.get("phase") or "unknown")
        env = raw.get("env")
        if not env:
            workload = getattr(self.source, "workload", None)
            env = workload.get("env") if isinstance(workload, Mapping) else None
        return {"situation": "training" if mode in ("online", "fixed") else "tuning",
                "searching": phase in SEARCH_PHASES,
                "env": None if not env else (", ".join(map(str, env)) if isinstance(env, (list, tuple)) else str(env)),
                "best_config_code": _config_code(best)}

    def history(self) -> list[dict[str, Any]]:
        """The source's recorded collects (:meth:`StatusSnapshot.history`), shaped; a source
        without one (a raw tuner) has none."""
        read = getattr(self.source, "history", None)
        try:
            raw = list(read()) if callable(read) else []
        except Exception:  # noqa: BLE001 - a status feed never fails a request
            raw = []
        out = []
        for p in raw:
            if not isinstance(p, Mapping) or _finite(p.get("at")) is None:
                continue
            cfg = _config_dict(p.get("config"))
            out.append({"at": _finite(p.get("at")), "steps": _int(p.get("steps"), None),
                        "seconds": _finite(p.get("seconds")), "steps_per_second": _finite(p.get("steps_per_second")),
                        "env_seconds": _finite(p.get("env_seconds")), "policy_seconds": _finite(p.get("policy_seconds")),
                        "wait_seconds": _finite(p.get("wait_seconds")), "config": cfg, "label": _config_label(cfg)})
        return out

    def trials(self) -> list[dict[str, Any]]:
        raw = self.raw_trials()
        cached = self._cache
        if cached is not None and cached[0] is raw:  # a snapshot's unchanged tuple: shaped already
            return cached[1]
        out = self._shape_trials(raw)
        if isinstance(raw, tuple):
            self._cache = (raw, out)  # holds raw, so its identity cannot be reused meanwhile
        return out

    def _shape_trials(self, raw: Sequence[Any]) -> list[dict[str, Any]]:
        out = []
        for i, t in enumerate(raw):
            if not isinstance(t, Mapping):
                t = _jsonable(t)
                if not isinstance(t, Mapping):
                    continue
            cfg = _config_dict(t.get("config"))
            samples = t.get("samples") if isinstance(t.get("samples"), (list, tuple)) else []
            warmup = t.get("warmup") if isinstance(t.get("warmup"), (list, tuple)) else []
            err = t.get("error")
            out.append({
                "index": i, "config": cfg, "label": _config_label(cfg) or str(t.get("config", "")),
                "source": str(t.get("source") or ""), "status": str(t.get("status") or ""),
                "stop_reason": str(t.get("stop_reason") or ""), "error": None if err is None else str(err),
                "mean": _finite(t.get("median", t.get("mean"))), "half_width": _finite(t.get("half_width")),
                "low": _finite(t.get("low")), "high": _finite(t.get("high")), "confidence": _finite(t.get("confidence")),
                "n": _int(t.get("n"), len(samples)), "samples": [_finite(s) for s in samples],
                "warmup": [_finite(s) for s in warmup],
                "reconfigure_seconds": _finite(t.get("reconfigure_seconds")),
                "predicted": _finite(t.get("predicted")), "started": _finite(t.get("started")),
                "seconds": _finite(t.get("seconds")),
            })
        return out
