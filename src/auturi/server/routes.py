"""The FastAPI app: the routes, their JSON errors and the OpenAPI schema's declarations."""
import time
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from auturi._version import __version__
from auturi.server.guard import _Guard
from auturi.server.limits import BodyLimit, ServerLimits
from auturi.server.metrics import render_metrics
from auturi.server.page import render_page
from auturi.server.schema import TRIAL_SOURCES, TRIAL_STATUSES, _models
from auturi.server.shape import _jsonable, _Reader


def create_app(source: Any, *, token: str | None = None, bound_host: str = "127.0.0.1",
               hardware: Mapping[str, Any] | None = None, title: str = "Auturi status",
               max_body_bytes: int = ServerLimits.max_body_bytes) -> Any:
    """The FastAPI app (without a server): useful with ``fastapi.testclient.TestClient``.
    A request body over ``max_body_bytes`` is 413 (:class:`~auturi.server.limits.BodyLimit`)."""
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

    @app.get("/history", response_model=M["HistoryModel"], summary="Recorded training collects over wall time")
    async def get_history() -> JSONResponse:
        return JSONResponse({"points": reader.history()}, headers=nocache)

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus text format",
             responses={200: {"content": {"text/plain": {}}}, **_json_errors(M, {503: "prometheus_client is missing"})})
    async def get_metrics() -> PlainTextResponse:
        try:
            text = render_metrics(reader.status(), reader.trials())
        except ImportError as e:  # the server extra without prometheus_client: say what to install
            return JSONResponse({"detail": str(e)}, status_code=503)  # type: ignore[return-value]
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8", headers=nocache)

    @app.get("/healthz", response_model=M["HealthModel"], summary="Liveness")
    async def get_healthz() -> JSONResponse:
        phase = str(reader.raw_status().get("phase") or "unknown")
        return JSONResponse({"status": "ok", "phase": phase, "uptime_seconds": time.time() - reader.started})

    @app.get("/", response_class=HTMLResponse, summary="A page: configs ranked while tuning, throughput over time while training",
             responses={200: {"content": {"text/html": {}}}, **bad_param})
    async def get_page(
        refresh: Annotated[float, Query(ge=0.5, le=3600.0, description="Seconds between refreshes")] = 2.0,
    ) -> HTMLResponse:
        st = reader.status()
        history = reader.history() if st["situation"] == "training" else []
        page = render_page(st, reader.trials(), refresh=refresh, title=title, history=history)
        csp = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
               "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'")
        return HTMLResponse(page, headers={**nocache, "Content-Security-Policy": csp})

    if token is not None:
        _document_security(app)
    app.add_middleware(_Guard, token=token, bound_host=bound_host)
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)  # added last: runs first
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
