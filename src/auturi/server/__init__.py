"""The HTTP status endpoint: a FastAPI app served by uvicorn on a background thread of the
tuning (or training) process.

A package split by role: ``snapshot`` (what is served), ``shape`` (a source's reports made
safe), ``schema`` (the pydantic models), ``guard`` (token and ``Host`` rules), ``limits``
(what one client may hold), ``routes`` (the app), ``metrics`` (Prometheus), ``page`` with
``page.html`` (the page, package data) and ``serve`` (the uvicorn thread).

Endpoints (all ``GET``):

- ``/status``: phase, current and best config (and the best as an ``auturi.Config(...)``
  line), throughput now and best, trials done, budget left, the env, whether this is a tuning
  or a training run, and the recorded training collects' counters and latest time split
  (JSON, :class:`StatusModel`);
- ``/trials``: every trial with its samples (JSON, :class:`TrialsModel`; ``offset``,
  ``limit``, ``status``, ``source`` filter it);
- ``/history``: the recorded training collects over wall time, each with its layout and time
  split (JSON, :class:`HistoryModel`; the latest 1,000);
- ``/metrics``: the same numbers in the Prometheus text format, with bounded label sets
  (:mod:`auturi.server.metrics`; needs ``prometheus_client``);
- ``/healthz``: liveness;
- ``/``: a self-contained page (no external script) that refreshes itself: while tuning,
  configs ranked by throughput with intervals and the choice's config line; while training,
  throughput over wall time with the reconfigures marked and where the time goes;
- ``/openapi.json``: the schema.

``source`` is any object with ``status() -> dict`` and ``trials() -> list[dict]``, such as a
:class:`~auturi.tuner.Tuner`. Serving must not slow collection, so the recommended source is
a :class:`StatusSnapshot` fed by the tuner's callback: the tuner's thread publishes a new
snapshot (one reference assignment, no lock) at each event, between collects, and a request
only reads the latest one. A raw tuner works too, but then every request computes the status
in the server thread. A training loop also calls :meth:`StatusSnapshot.record_collect` after
each collect (the page's timeline, the step counters, the time split).

Security: the server binds loopback (``127.0.0.1``) by default. Binding any other address
requires a ``token``; then every request must carry it, as ``Authorization: Bearer TOKEN`` or
``?token=TOKEN``, or gets 401. Without a token the server answers only requests whose
``Host`` header is exactly a loopback address or name (``127.0.0.1`` or any 127.x.y.z
literal, ``[::1]``, ``localhost``, or the name it was bound to; any port), and 400 to others,
including a request with no ``Host`` (a guard against DNS rebinding: ``127.0.0.1.evil.example``
is an attacker's name, not an address). Errors are JSON (``{"detail": ...}``, declared so in
the OpenAPI schema): 400 for such a ``Host``, 401 for a missing token, 404 for an unknown
path, 422 for a bad parameter.

Limits (``StatusServer(..., limits=ServerLimits(...))``; module ``limits``): one client cannot
hold the process's memory or the server's connections. A request head over 32 KiB is 431, a
body over 64 KiB 413, a request not received whole within 10 s of its first byte (or of the
connection's start) 408, a connection beyond 32 open ones 503, each closing the connection;
a connection idle 5 s between requests is closed. The OpenAPI schema does not list these
answers: they come before any route (431, 408 and 503 before the app sees the request).

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
from auturi.server.guard import is_loopback
from auturi.server.limits import ServerLimits
from auturi.server.metrics import render_metrics
from auturi.server.page import LINE_COLOUR, render_page
from auturi.server.routes import create_app
from auturi.server.schema import PHASES, TRIAL_SOURCES, TRIAL_STATUSES, _models  # noqa: F401 - the tests build the models
from auturi.server.serve import ServerError, StatusServer
from auturi.server.snapshot import StatusSnapshot

__all__ = ["LINE_COLOUR", "PHASES", "ServerError", "ServerLimits", "StatusServer", "StatusSnapshot", "TRIAL_SOURCES",
           "TRIAL_STATUSES", "create_app", "is_loopback", "render_metrics", "render_page"]
