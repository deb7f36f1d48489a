"""The HTTP status endpoint: a FastAPI app served by uvicorn on a background thread of the
tuning (or training) process.

Still one module (over 500 lines): snapshot, schema, Host guard, routes, metrics and the page
are split into a package by role when the page and metrics are redesigned, not before.

Endpoints (all ``GET``):

- ``/status``: phase, current and best config, throughput now and best, trials done, budget
  left, hardware (JSON, :class:`StatusModel`);
- ``/trials``: every trial with its samples (JSON, :class:`TrialsModel`; ``offset``,
  ``limit``, ``status``, ``source`` filter it);
- ``/metrics``: the same numbers in the Prometheus text format;
- ``/healthz``: liveness;
- ``/``: a self-contained page (no external script) that plots throughput per trial and
  refreshes itself;
- ``/openapi.json``: the schema.

(One module of ~1,000 lines, a sixth of it the page's HTML and script: the app, its guard,
its page and the server that runs it change together.)

``source`` is any object with ``status() -> dict`` and ``trials() -> list[dict]``, such as a
:class:`~auturi.tuner.Tuner`. Serving must not slow collection, so the recommended source is
a :class:`StatusSnapshot` fed by the tuner's callback: the tuner's thread publishes a new
snapshot (one reference assignment, no lock) at each event, between collects, and a request
only reads the latest one. A raw tuner works too, but then every request computes the status
in the server thread.

Security: the server binds loopback (``127.0.0.1``) by default. Binding any other address
requires a ``token``; then every request must carry it, as ``Authorization: Bearer TOKEN`` or
``?token=TOKEN``, or gets 401. Without a token the server answers only requests whose
``Host`` header is exactly a loopback address or name (``127.0.0.1`` or any 127.x.y.z
literal, ``[::1]``, ``localhost``, or the name it was bound to; any port), and 400 to others,
including a request with no ``Host`` (a guard against DNS rebinding: ``127.0.0.1.evil.example``
is an attacker's name, not an address). Errors are JSON (``{"detail": ...}``, declared so in
the OpenAPI schema): 400 for such a ``Host``, 401 for a missing token, 404 for an unknown
path, 422 for a bad parameter.

Example:
    >>> from auturi.server import StatusServer, StatusSnapshot
    >>> snap = StatusSnapshot()
    >>> snap.update(status={"phase": "search", "trials": 3})
    >>> server = StatusServer(snap)
    >>> url = server.start()
    >>> import json, urllib.request
    >>> json.load(urllib.request.urlopen(url + "status"))["phase"]
    'search'
    >>> server.stop()
"""
import contextlib
import functools
import hmac
import html
import ipaddress
import json
import logging
import math
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs

from auturi._version import __version__
from auturi.errors import AuturiError

__all__ = ["ServerError", "StatusServer", "StatusSnapshot", "create_app", "is_loopback", "render_metrics"]

PHASES = ("idle", "baseline", "profiling", "search", "final", "done", "failed", "explore", "locked", "research", "paused")
TRIAL_STATUSES = ("running", "ok", "invalid", "failed")
TRIAL_SOURCES = ("start", "serial", "cache", "search", "final", "confirm", "online", "research")
LINE_COLOUR = "#1f77b4"
"""The colour of the throughput line on the page (the browser test looks for it)."""

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


class ServerError(AuturiError, ValueError):
    """The status server cannot start as asked; the message says how to fix it."""


# ---------------------------------------------------------------------------- snapshot
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


# ---------------------------------------------------------------------------- coercion helpers
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


# ---------------------------------------------------------------------------- the app
def _config_model() -> Any:
    """One layout as a pydantic model: the knobs :meth:`auturi.Config.knob_names` declares,
    with Config's types; every integer knob is at least 1."""
    import typing

    from pydantic import Field, create_model

    from auturi.config import Config

    hints = typing.get_type_hints(Config)
    fields = {k: (hints[k], Field(ge=1) if hints[k] is int else ...) for k in Config.knob_names()}
    return create_model("ConfigModel", __doc__="One layout (:class:`auturi.Config`).", **fields)


def _models() -> dict[str, Any]:
    """Pydantic models, built on first use so ``import auturi.server`` stays light."""
    from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

    Num = Annotated[float | None, BeforeValidator(_finite)]

    ConfigModel = _config_model()

    class BudgetModel(BaseModel):
        trials: int | None = Field(None, description="Trials allowed (None: the strategy's own stop)")
        trials_left: int | None = None
        seconds: Num = Field(None, description="Wall seconds allowed for the search")
        seconds_left: Num = None

    class StatusModel(BaseModel):
        """Where tuning stands."""

        model_config = ConfigDict(json_schema_extra={"example": {"phase": "search", "trials_done": 4}})

        phase: str = Field(description=f"One of {', '.join(PHASES)} (or what the source reports)")
        mode: str | None = Field(None, description="offline or online")
        strategy: str | None = None
        current_config: ConfigModel | None = Field(None, description="The config being measured now")
        current_config_label: str = ""
        current_samples: int = 0
        best_config: ConfigModel | None = None
        best_config_label: str = ""
        best_throughput: Num = Field(None, description="Best throughput measured: the median of its samples (env steps/s)")
        best_half_width: Num = Field(None, description="Larger distance from that median to an end of its interval (steps/s)")
        best_low: Num = Field(None, description="Lower end of the median's distribution-free interval (steps/s)")
        best_high: Num = Field(None, description="Upper end of that interval (steps/s)")
        best_confidence: Num = Field(None, description="The interval's exact confidence (0..1)")
        throughput_now: Num = Field(None, description="Throughput of the latest measured collect (steps/s)")
        throughput_now_age_seconds: Num = None
        trials_done: int = 0
        trials_ok: int = 0
        budget: BudgetModel
        elapsed_seconds: Num = None
        cache_hit: bool | None = None
        space: dict[str, Any] | None = None
        hardware: dict[str, Any] = Field(default_factory=dict, description="The hardware fingerprint")
        extra: dict[str, Any] = Field(default_factory=dict, description="Other fields the source reports")
        snapshot_age_seconds: Num = Field(None, description="Seconds since the source last published")
        server_time: float

    class TrialModel(BaseModel):
        """One measured config with all its samples."""

        index: int
        config: ConfigModel | None
        label: str
        source: str = ""
        status: str = ""
        stop_reason: str = ""
        error: str | None = None
        mean: Num = Field(None, description="Throughput estimate: the median of the samples (steps/s)")
        half_width: Num = Field(None, description="Larger distance from the median to an end of its interval (steps/s)")
        low: Num = Field(None, description="Lower end of the median's distribution-free interval (steps/s)")
        high: Num = Field(None, description="Upper end of that interval (steps/s)")
        confidence: Num = Field(None, description="The interval's exact confidence (0..1; none below 3 samples)")
        n: int = 0
        samples: list[Num] = Field(default_factory=list)
        warmup: list[Num] = Field(default_factory=list)
        reconfigure_seconds: Num = None
        predicted: Num = None
        started: Num = None
        seconds: Num = None

    class TrialsModel(BaseModel):
        total: int = Field(description="Trials matching the filters, before offset and limit")
        offset: int
        trials: list[TrialModel]

    class HealthModel(BaseModel):
        status: Literal["ok"] = "ok"
        phase: str
        uptime_seconds: float

    class ErrorModel(BaseModel):
        detail: Any

    return {k: v for k, v in locals().items() if isinstance(v, type) and issubclass(v, BaseModel)}


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
                 "cache_hit", "updated_at", "hardware"}
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
        }

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


def is_loopback(host: str) -> bool:
    """True when ``host`` names only loopback addresses (``127.0.0.0/8``, ``::1``, localhost)."""
    h = host.strip().strip("[]").lower()
    if not h:
        return False  # "" means every interface
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        pass
    if h in _LOOPBACK_NAMES:
        return True
    try:
        infos = socket.getaddrinfo(h, None)
    except OSError:
        return False
    addrs = {info[4][0] for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def _is_ip(h: str) -> bool:
    try:
        ipaddress.ip_address(h)
    except ValueError:
        return False
    return True


def _host_of(header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:8000`` -> ``::1``)."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def _is_loopback_host_header(value: str, names: frozenset[str]) -> bool:
    """True when a ``Host`` header addresses this server by a loopback IP literal
    (``127.0.0.0/8``, ``[::1]``) or by one of ``names`` (localhost, the bound name), exactly,
    with an optional numeric port.

    An exact match, not a prefix: ``127.evil.example`` or ``127.0.0.1.evil.example`` are DNS
    names an attacker controls and can point at 127.0.0.1 (DNS rebinding), while an IP literal
    (any of 127.0.0.0/8) names no DNS record at all, so it cannot be an attacker's."""
    h = value.lower()
    if h.startswith("["):  # an IPv6 literal, bracketed as a Host header requires
        end = h.find("]")
        host, rest = (h[1:end], h[end + 1:]) if end > 0 else ("", "")
        if not _port_ok(rest):
            return False
        try:
            return ipaddress.IPv6Address(host).is_loopback
        except ValueError:
            return False
    host, colon, port = h.partition(":")
    if colon and not _port_ok(":" + port):
        return False
    if host in names:
        return True
    try:
        return ipaddress.IPv4Address(host).is_loopback  # strict dotted quad: no "127.1", no "0x7f.1"
    except ValueError:
        return False


def _port_ok(rest: str) -> bool:
    """``rest`` is empty or ``:`` and a port number."""
    return rest == "" or (rest[:1] == ":" and rest[1:].isascii() and rest[1:].isdigit() and len(rest) <= 6
                          and int(rest[1:]) <= 65535)


def _host_refusal(hosts: list[str]) -> str:
    what = (f"host {hosts[0]!r} is" if len(hosts) == 1 else
            "a request without a Host header is" if not hosts else "several Host headers are")
    return (f"{what} not allowed: without a token this server answers only requests addressed to a loopback "
            f"name or address (localhost, 127.0.0.1, [::1]); open http://127.0.0.1:PORT/, or serve with a token")


class _Guard:
    """ASGI middleware: the token rule, and the loopback ``Host`` rule when there is no token."""

    def __init__(self, app: Any, token: str | None, bound_host: str):
        self.app, self.token = app, token
        bound = _host_of(bound_host)
        # The bound host counts when it is a name (an operator who binds "myhost" opens
        # http://myhost:PORT/); an address is covered by the literal rule already.
        self.names = frozenset({"localhost"} | ({bound} if bound and not _is_ip(bound) else set()))

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.responses import JSONResponse

        raw = scope.get("headers", [])
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}
        if self.token is None:
            hosts = [v.decode("latin-1") for k, v in raw if k.lower() == b"host"]
            if len(hosts) != 1 or not _is_loopback_host_header(hosts[0], self.names):
                resp = JSONResponse({"detail": _host_refusal(hosts)}, status_code=400)
                await resp(scope, receive, send)
                return
        elif not self._authorised(headers, scope.get("query_string", b"")):
            resp = JSONResponse({"detail": "missing or wrong token: send 'Authorization: Bearer TOKEN' or ?token=TOKEN"},
                                status_code=401, headers={"WWW-Authenticate": 'Bearer realm="auturi"'})
            await resp(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorised(self, headers: dict[str, str], query: bytes) -> bool:
        assert self.token is not None
        want = self.token.encode()
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer " and hmac.compare_digest(auth[7:].strip().encode("latin-1"), want):
            return True
        try:
            given = parse_qs(query.decode("latin-1"), keep_blank_values=True).get("token", [])
        except ValueError:
            return False
        return any(hmac.compare_digest(g.encode("utf-8", "surrogateescape"), want) for g in given)


def create_app(source: Any, *, token: str | None = None, bound_host: str = "127.0.0.1",
               hardware: Mapping[str, Any] | None = None, title: str = "Auturi status") -> Any:
    """The FastAPI app (without a server): useful with ``fastapi.testclient.TestClient``."""
    from fastapi import FastAPI, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException

    M = _models()
    reader = _Reader(source, dict(hardware) if hardware else None)
    bad_param = _json_errors(M, {422: "Bad parameter"})
    # What the guard answers before any route runs: every route can get it.
    guard = ({401: "Missing or wrong token"} if token is not None
             else {400: "Host missing or not a loopback name or address"})
    app = FastAPI(title=title, version=__version__, docs_url=None, redoc_url=None, openapi_url="/openapi.json",
                  description="Live state of an Auturi tuning run. GET only.", responses=_json_errors(M, guard))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _jsonable(exc.errors())}, status_code=422)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:  # pragma: no cover - a bug, still JSON
        return JSONResponse({"detail": f"internal error: {type(exc).__name__}"}, status_code=500)

    nocache = {"Cache-Control": "no-store"}
    trials_body: list[Any] = [None]  # (shaped trial list, query, JSON bytes) of the last /trials answer

    @app.get("/status", response_model=M["StatusModel"], summary="Where tuning stands")
    async def get_status() -> JSONResponse:
        st = reader.status()
        try:
            body = M["StatusModel"](**st).model_dump(mode="json")
        except Exception as e:  # noqa: BLE001 - a source with odd fields still gets an answer
            body = M["StatusModel"](phase=st.get("phase", "unknown"), budget={}, server_time=time.time(),
                                    extra={"error": f"could not shape the source's status: {e}"[:500]}
                                    ).model_dump(mode="json")
        return JSONResponse(body, headers=nocache)

    @app.get("/trials", response_model=M["TrialsModel"], summary="Every trial with its samples",
             responses=bad_param)
    async def get_trials(
        offset: Annotated[int, Query(ge=0, le=1_000_000_000, description="Skip this many trials")] = 0,
        limit: Annotated[int | None, Query(ge=1, le=100_000, description="Return at most this many")] = None,
        status: Annotated[Literal[TRIAL_STATUSES] | None, Query(description="Only trials with this status")] = None,  # type: ignore[valid-type]
        source: Annotated[Literal[TRIAL_SOURCES] | None, Query(description="Only trials measured for this reason")] = None,  # type: ignore[valid-type]
    ) -> JSONResponse:
        shaped = reader.trials()
        key = (offset, limit, status, source)
        cached = trials_body[0]
        if cached is not None and cached[0] is shaped and cached[1] == key:
            body = cached[2]  # the same snapshot and query as the last request: its bytes
        else:
            rows = [t for t in shaped
                    if (status is None or t["status"] == status) and (source is None or t["source"] == source)]
            page = rows[offset:] if limit is None else rows[offset:offset + limit]
            # Shaped by _Reader to TrialModel's types already (the schema tests check it), so no
            # per-request validation: this path runs ten times a second beside collection.
            body = JSONResponse({"total": len(rows), "offset": offset, "trials": page}).body
            trials_body[0] = (shaped, key, body)  # holds `shaped`, so its identity is not reused
        return Response(body, media_type="application/json", headers=nocache)

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus text format",
             responses={200: {"content": {"text/plain": {}}}})
    async def get_metrics() -> PlainTextResponse:
        text = render_metrics(reader.status(), reader.trials())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8", headers=nocache)

    @app.get("/healthz", response_model=M["HealthModel"], summary="Liveness")
    async def get_healthz() -> JSONResponse:
        phase = str(reader.raw_status().get("phase") or "unknown")
        return JSONResponse({"status": "ok", "phase": phase, "uptime_seconds": time.time() - reader.started})

    @app.get("/", response_class=HTMLResponse, summary="A page that plots throughput per trial",
             responses={200: {"content": {"text/html": {}}}, **bad_param})
    async def get_page(
        refresh: Annotated[float, Query(ge=0.5, le=3600.0, description="Seconds between refreshes")] = 2.0,
    ) -> HTMLResponse:
        page = render_page(reader.status(), reader.trials(), refresh=refresh, title=title)
        csp = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
               "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'")
        return HTMLResponse(page, headers={**nocache, "Content-Security-Policy": csp})

    if token is not None:
        _document_security(app)
    app.add_middleware(_Guard, token=token, bound_host=bound_host)
    return app


def _json_errors(models: dict[str, Any], codes: Mapping[int, str]) -> dict[int, Any]:
    """OpenAPI responses for JSON errors, each declared as ``application/json`` with the error
    schema. Not FastAPI's ``model=``: that files the schema under the route's own media type,
    which for the page would claim its 422 is ``text/html``."""
    content = {"application/json": {"schema": models["ErrorModel"].model_json_schema()}}
    return {code: {"description": what, "content": content} for code, what in codes.items()}


def _document_security(app: Any) -> None:
    """Declare the bearer/query token in the OpenAPI schema."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer"},
                "token": {"type": "apiKey", "in": "query", "name": "token"},
            }
            schema["security"] = [{"bearer": []}, {"token": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


# ---------------------------------------------------------------------------- metrics
def _label(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_metrics(status: Mapping[str, Any], trials: Sequence[Mapping[str, Any]]) -> str:
    """The Prometheus text exposition (format 0.0.4) of a shaped status and trial list."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: Sequence[tuple[dict[str, Any], Any]]) -> None:
        rows = [(labels, _finite(v)) for labels, v in samples]
        rows = [(labels, v) for labels, v in rows if v is not None]
        if not rows:
            return
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, v in rows:
            lab = ",".join(f'{k}="{_label(x)}"' for k, x in labels.items())
            num = str(int(v)) if v.is_integer() and abs(v) < 2**53 else repr(v)
            lines.append(f"{name}{{{lab}}} {num}" if lab else f"{name} {num}")

    phase = str(status.get("phase") or "unknown")
    metric("auturi_up", "gauge", "1 while the status server answers.", [({}, 1)])
    metric("auturi_tuner_info", "gauge", "Mode, strategy and phase of the tuner (always 1).",
           [({"mode": status.get("mode") or "", "strategy": status.get("strategy") or "", "phase": phase}, 1)])
    phases = list(PHASES) + ([phase] if phase not in PHASES else [])
    metric("auturi_tuner_phase", "gauge", "1 for the current phase, 0 for the others.",
           [({"phase": p}, int(p == phase)) for p in phases])
    metric("auturi_tuner_trials_total", "counter", "Trials finished.", [({}, status.get("trials_done"))])
    metric("auturi_tuner_trials_ok_total", "counter", "Trials finished with a measurement.",
           [({}, status.get("trials_ok"))])
    metric("auturi_tuner_best_throughput_steps_per_second", "gauge", "Best throughput measured (median of its samples).",
           [({"config": status.get("best_config_label") or ""}, status.get("best_throughput"))])
    metric("auturi_tuner_best_half_width_steps_per_second", "gauge", "Larger distance from the best median to an end of its interval.",
           [({}, status.get("best_half_width"))])
    metric("auturi_tuner_throughput_steps_per_second", "gauge", "Throughput of the latest measured collect.",
           [({}, status.get("throughput_now"))])
    metric("auturi_tuner_current_samples", "gauge", "Samples of the trial running now.",
           [({}, status.get("current_samples"))])
    budget = status.get("budget") or {}
    metric("auturi_tuner_budget_trials_left", "gauge", "Trials the budget still allows.",
           [({}, budget.get("trials_left"))])
    metric("auturi_tuner_budget_seconds_left", "gauge", "Seconds the budget still allows.",
           [({}, budget.get("seconds_left"))])
    metric("auturi_tuner_elapsed_seconds", "gauge", "Seconds since tuning began.",
           [({}, status.get("elapsed_seconds"))])
    metric("auturi_trial_throughput_steps_per_second", "gauge", "Mean throughput of each trial.",
           [({"index": t["index"], "source": t.get("source", ""), "config": t.get("label", "")}, t.get("mean"))
            for t in trials])
    metric("auturi_trial_samples", "gauge", "Measured collects of each trial.",
           [({"index": t["index"], "source": t.get("source", ""), "config": t.get("label", "")}, t.get("n"))
            for t in trials])
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- the page
def _script_json(x: Any) -> str:
    """JSON that is safe inside a <script> element."""
    return (json.dumps(_jsonable(x), allow_nan=False).replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:16px;color:#222;background:#fff}
h1{font-size:18px;margin:0 0 8px}
#facts{display:flex;flex-wrap:wrap;gap:6px 20px;margin:0 0 10px}
#facts b{font-weight:600}
#plot{width:100%;max-width:1000px;height:340px;border:1px solid #ddd;display:block}
table{border-collapse:collapse;margin-top:10px;font-size:12px}
td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #eee}
td.c,th.c{text-align:left}
.err{color:#b00}
</style></head><body>
<h1>__TITLE__</h1>
<div id="facts"></div>
<svg id="plot" viewBox="0 0 1000 340" preserveAspectRatio="none" role="img"
     aria-label="throughput per trial"></svg>
<table id="tbl"></table>
<script>
"use strict";
const COLOUR = "__COLOUR__", BEST = "#2ca02c", REFRESH = __REFRESH__;
let data = {status: __STATUS__, trials: __TRIALS__};
const token = new URLSearchParams(location.search).get("token");
const hdrs = token ? {"Authorization": "Bearer " + token} : {};
const NS = "http://www.w3.org/2000/svg";
function fmt(x) { return x === null || x === undefined ? "-" : Math.round(x).toLocaleString("en-US"); }
function el(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  parent.appendChild(e); return e;
}
function facts(s) {
  const b = s.budget || {};
  const left = [b.trials_left !== null && b.trials_left !== undefined ? b.trials_left + " trials" : null,
                b.seconds_left !== null && b.seconds_left !== undefined ? b.seconds_left.toFixed(0) + " s" : null]
               .filter(x => x).join(", ") || "-";
  const items = [["phase", s.phase], ["trials", s.trials_done], ["now", fmt(s.throughput_now) + " steps/s"],
                 ["best", fmt(s.best_throughput) + " steps/s"], ["budget left", left],
                 ["best config", s.best_config_label || "-"], ["measuring", s.current_config_label || "-"]];
  const f = document.getElementById("facts"); f.textContent = "";
  for (const [k, v] of items) {
    const d = document.createElement("div");
    const kb = document.createElement("b"); kb.textContent = k + ": ";
    d.appendChild(kb); d.appendChild(document.createTextNode(String(v))); f.appendChild(d);
  }
}
function plot(trials) {
  const svg = document.getElementById("plot"); svg.textContent = "";
  const W = 1000, H = 340, L = 70, R = 20, T = 15, B = 40;
  const pts = trials.filter(t => t.mean !== null && t.mean !== undefined);
  el("rect", {x: L, y: T, width: W - L - R, height: H - T - B, fill: "#fafafa", stroke: "#ccc"}, svg);
  if (!pts.length) {
    const t = el("text", {x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#888"}, svg);
    t.textContent = "waiting for the first trial"; return;
  }
  const top = Math.max(...pts.map(t => t.mean + (t.half_width || 0)), 1);
  const raw = top / 4, mag = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / mag;
  const step = (m <= 1 ? 1 : m <= 2 ? 2 : m <= 2.5 ? 2.5 : m <= 5 ? 5 : 10) * mag;
  const hi = Math.ceil(top / step) * step;
  const n = Math.max(trials.length, 2);
  const x = i => L + (W - L - R) * (trials.length === 1 ? 0.5 : i / (n - 1));
  const y = v => T + (H - T - B) * (1 - Math.min(Math.max(0, v), hi) / hi);
  for (let v = 0; v <= hi + step / 2; v += step) {
    const yy = y(v);
    el("line", {x1: L, x2: W - R, y1: yy, y2: yy, stroke: "#e5e5e5"}, svg);
    const lab = el("text", {x: L - 6, y: yy + 4, "text-anchor": "end", "font-size": 11, fill: "#666"}, svg);
    lab.textContent = fmt(v);
  }
  const every = Math.max(1, Math.ceil(trials.length / 25));
  for (const t of trials) if (t.index % every === 0) {
    const lab = el("text", {x: x(t.index), y: H - B + 14, "text-anchor": "middle", "font-size": 11, fill: "#666"}, svg);
    lab.textContent = String(t.index);
  }
  const xl = el("text", {x: (W + L) / 2, y: H - 4, "text-anchor": "middle", "font-size": 12, fill: "#444"}, svg);
  xl.textContent = "trial  (mean steps/s and 95% interval; green: best)";
  // The best is the tuner's (its latest measurement, e.g. the final re-measure), else the top mean.
  let best = null;
  for (const t of pts) if (t.label && t.label === (data.status || {}).best_config_label) best = t;
  if (!best) { best = pts[0]; for (const t of pts) if (t.mean > best.mean) best = t; }
  for (const t of pts) if (t.half_width) {
    el("line", {x1: x(t.index), x2: x(t.index), y1: y(t.mean - t.half_width), y2: y(t.mean + t.half_width),
                stroke: "#9ab", "stroke-width": 2}, svg);
  }
  el("polyline", {points: pts.map(t => x(t.index) + "," + y(t.mean)).join(" "), fill: "none", stroke: COLOUR,
                  "stroke-width": 4, "stroke-linejoin": "round"}, svg);
  for (const t of pts) {
    const c = el("circle", {cx: x(t.index), cy: y(t.mean), r: t === best ? 8 : 6,
                            fill: t === best ? BEST : COLOUR}, svg);
    const tip = el("title", {}, c); tip.textContent = "#" + t.index + " " + t.label + ": " + fmt(t.mean) + " steps/s";
  }
}
function table(trials) {
  const tb = document.getElementById("tbl"); tb.textContent = "";
  const head = tb.insertRow();
  for (const h of ["#", "steps/s", "+-", "n", "source", "config"]) {
    const th = document.createElement("th"); th.textContent = h; if (h === "config") th.className = "c";
    head.appendChild(th);
  }
  for (const t of trials.slice().reverse().slice(0, 30)) {
    const r = tb.insertRow();
    const cells = [t.index, fmt(t.mean), fmt(t.half_width), t.n, t.source, t.label + (t.error ? "  " + t.error : "")];
    cells.forEach((v, i) => { const c = r.insertCell(); c.textContent = String(v); if (i === 5) c.className = "c"; });
    if (t.status === "failed" || t.status === "invalid") r.className = "err";
  }
}
function draw() { facts(data.status); plot(data.trials); table(data.trials); }
async function poll() {
  try {
    const [s, t] = await Promise.all([fetch("status", {headers: hdrs}), fetch("trials", {headers: hdrs})]);
    if (s.ok && t.ok) { data = {status: await s.json(), trials: (await t.json()).trials}; draw(); }
  } catch (e) { /* the run may have ended: keep the last picture */ }
  setTimeout(poll, REFRESH * 1000);
}
draw();
setTimeout(poll, REFRESH * 1000);
</script></body></html>
"""


def render_page(status: Mapping[str, Any], trials: Sequence[Mapping[str, Any]], refresh: float = 2.0,
                title: str = "Auturi status") -> str:
    """The self-contained status page, with the current data embedded (the first paint needs
    no request) and a script that refreshes it every ``refresh`` seconds."""
    return (_PAGE.replace("__TITLE__", html.escape(title)).replace("__COLOUR__", LINE_COLOUR)
            .replace("__REFRESH__", repr(float(refresh))).replace("__STATUS__", _script_json(status))
            .replace("__TRIALS__", _script_json(trials)))


# ---------------------------------------------------------------------------- the server
_QUIET: Any = None


def _quiet_server_class() -> Any:
    """``uvicorn.Server`` with its housekeeping tick at 1 Hz instead of 10 Hz (each wake-up of
    the server thread takes the GIL from the collecting thread), woken at once by ``stop()``."""
    global _QUIET
    if _QUIET is not None:
        return _QUIET
    import asyncio

    import uvicorn

    class QuietServer(uvicorn.Server):
        _wake_event: Any = None
        _wake_loop: Any = None

        async def main_loop(self) -> None:
            self._wake_loop, self._wake_event = asyncio.get_running_loop(), asyncio.Event()
            counter = 0
            should_exit = await self.on_tick(counter)
            while not should_exit:
                counter = (counter + 10) % 864000  # on_tick refreshes the Date header when counter % 10 == 0
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake_event.wait(), 1.0)
                should_exit = await self.on_tick(counter)

        def wake(self) -> None:
            loop, event = self._wake_loop, self._wake_event
            if loop is not None and event is not None:
                with contextlib.suppress(RuntimeError):  # the loop has already closed
                    loop.call_soon_threadsafe(event.set)

    # Only where uvicorn still runs its loop through these two methods; else its own loop.
    ok = callable(getattr(uvicorn.Server, "main_loop", None)) and callable(getattr(uvicorn.Server, "on_tick", None))
    _QUIET = QuietServer if ok else uvicorn.Server
    return _QUIET


def _fast_or(fast: str, fallback: str) -> str:
    """``fast`` (uvloop's event loop, httptools' parser: C, in ``uvicorn[standard]``) when it is
    installed, else the pure-Python ``fallback``. Each request takes the GIL from the collecting
    thread; the C paths hold it for less and need fewer event-loop turns per request."""
    import importlib.util

    return fast if importlib.util.find_spec(fast) is not None else fallback


class StatusServer:
    """Serves :func:`create_app` with uvicorn on a daemon thread of this process.

    Args:
        source: an object with ``status()`` and ``trials()`` (a :class:`StatusSnapshot`, a tuner).
        host: address to bind; loopback by default. Any other address requires ``token``.
        port: TCP port; 0 picks a free one (see :attr:`port` after :meth:`start`).
        token: if set, every request must carry it (``Authorization: Bearer TOKEN`` or
            ``?token=TOKEN``) or gets 401.

    Raises:
        ServerError: a non-loopback ``host`` without a token, or a port that cannot be bound.
    """

    def __init__(self, source: Any, host: str = "127.0.0.1", port: int = 0, token: str | None = None, *,
                 title: str = "Auturi status", hardware: Mapping[str, Any] | None = None):
        if not hasattr(source, "status") or not hasattr(source, "trials"):
            raise TypeError(f"source must have status() and trials() methods (a Tuner or a StatusSnapshot), "
                            f"got {type(source).__name__}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ServerError(f"port must be an integer in 0..65535 (0: any free port), got {port!r}")
        token = token or None
        if not is_loopback(host) and token is None:
            raise ServerError(f"refusing to serve on {host or 'every interface'!r} without a token: anyone who can "
                              f"reach it could read it. Pass a token (--status-token / AUTURI_STATUS_TOKEN, or "
                              f"token=...) or bind 127.0.0.1")
        self.source, self.host, self.token, self.title = source, host, token, title
        self._requested_port = port
        self._hardware = dict(hardware) if hardware else None
        self.port: int | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str | None:
        """``http://HOST:PORT/`` once started."""
        if self.port is None:
            return None
        h = self.host or "0.0.0.0"
        h = f"[{h}]" if ":" in h else h
        return f"http://{h}:{self.port}/"

    def start(self, timeout: float = 10.0) -> str:
        """Bind, start serving on a background thread, and return the URL."""
        if self._thread is not None:
            return self.url or ""
        import uvicorn

        hardware = self._hardware
        if hardware is None and not getattr(self.source, "hardware", None):
            from auturi.tuner.cache import hardware_fingerprint

            hardware = hardware_fingerprint()
        app = create_app(self.source, token=self.token, bound_host=self.host, hardware=hardware, title=self.title)
        self._sock = self._bind()
        self.port = int(self._sock.getsockname()[1])
        config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False, lifespan="off",
                                loop=_fast_or("uvloop", "asyncio"), http=_fast_or("httptools", "h11"),
                                timeout_graceful_shutdown=1, server_header=False)
        self._server = _quiet_server_class()(config)
        self._thread = threading.Thread(target=self._run, name=f"auturi-status-{self.port}", daemon=True)
        self._thread.start()
        end = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                self._cleanup()
                raise ServerError(f"the status server on {self.host}:{self.port} stopped while starting")
            if time.monotonic() > end:
                self.stop()
                raise ServerError(f"the status server on {self.host}:{self.port} did not start in {timeout:.0f} s")
            time.sleep(0.01)
        return self.url or ""

    def _bind(self) -> socket.socket:
        try:
            infos = socket.getaddrinfo(self.host or None, self._requested_port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        except OSError as e:
            raise ServerError(f"cannot resolve status host {self.host!r} ({e}); use an IP address such as "
                              f"127.0.0.1") from None
        family, kind, proto, _, addr = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(128)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            what = "is in use" if e.errno == 98 else f"cannot be bound ({e.strerror})"
            raise ServerError(f"port {self._requested_port} on {self.host} {what}: pick another "
                              f"(--status-port PORT) or 0 for any free port") from None
        return sock

    def _run(self) -> None:
        assert self._server is not None and self._sock is not None
        try:
            self._server.run(sockets=[self._sock])
        except BaseException:
            logging.getLogger("auturi.server").exception("the status server on %s:%s stopped", self.host, self.port)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and join the thread. Idempotent."""
        if self._server is not None:
            self._server.should_exit = True
            wake = getattr(self._server, "wake", None)
            if wake is not None:
                wake()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout)
        self._cleanup()

    def _cleanup(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock, self._thread, self._server = None, None, None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "StatusServer":  # noqa: PYI034 - Python 3.10 has no typing.Self
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
