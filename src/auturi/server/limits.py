"""What one client may hold of the status server (it runs inside the tuning or training
process, so a client that holds memory or connections holds them there).

uvicorn's own settings cover part of it, and :class:`StatusServer` sets them: ``timeout_keep_alive``
(a connection idle between requests), ``limit_concurrency`` (503 once a request's head is
parsed while too many connections or tasks are open), ``h11_max_incomplete_event_size`` (the
pure-Python parser's buffer) and ``ws="none"``. Measured against uvicorn 0.54 with httptools
(2026-11-26), they leave open: a connection that never sends a request, or trickles its head
a byte at a time (uvicorn arms no timer before its first response), a head of any size (the
httptools parser buffers a header until it ends: a 64 MiB header was held whole), and any
number of connections that never finish a head (``limit_concurrency`` answers requests, not
connections). :func:`limited_protocol` closes those at the transport, for either parser:

- a request head over ``max_head_bytes``: 431, closed;
- a request (head and body) not received within ``request_timeout`` of its first byte, or of
  the connection's start for the first request: 408 (when no response is under way), closed;
- a connection beyond ``max_connections``: 503 at once, closed.

:class:`BodyLimit` (ASGI) answers 413 to a body over ``max_body_bytes``, declared by
``Content-Length`` or counted as it arrives chunked. Every endpoint is a GET: none needs one.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServerLimits:
    """The status server's limits (see the module's notes). The defaults are far above what a
    browser, curl or Prometheus sends (heads of a few hundred bytes to a few KiB of cookies, no
    body, a handful of connections) and far below what holds memory or the event loop."""

    max_head_bytes: int = 32 * 1024
    """Most bytes of a request line and headers: more is 431 and the connection closes."""
    max_body_bytes: int = 64 * 1024
    """Most bytes of a request body: more is 413 and the connection closes."""
    request_timeout: float = 10.0
    """Seconds to send one whole request (from its first byte; for a connection's first
    request, from the connection's start): later is 408 and the connection closes."""
    keep_alive_timeout: float = 5.0
    """Seconds a connection may idle between requests (uvicorn's ``timeout_keep_alive``)."""
    max_connections: int = 32
    """Most open connections; one more is answered 503 and closed at once."""

    def __post_init__(self) -> None:
        for name in ("max_head_bytes", "max_body_bytes", "max_connections"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ServerLimits.{name} must be an integer >= 1, got {v!r}")
        for name in ("request_timeout", "keep_alive_timeout"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)):
                raise ValueError(f"ServerLimits.{name} must be a number of seconds > 0, got {v!r}")


def _response(status: int, reason: str, detail: str) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, with the JSON error body every
    other error of this server has."""
    body = json.dumps({"detail": detail}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n\r\n").encode() + body


class _Limits:
    """Mixed in before uvicorn's HTTP protocol class (httptools or h11): the transport-level
    limits. The parser-specific subclasses below say when a request's head and the whole
    request have been received."""

    limits: ServerLimits = ServerLimits()
    # uvicorn's protocol classes provide these:
    connections: Any
    transport: Any
    loop: Any
    cycle: Any

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._head_bytes = 0  # bytes received of the current request's head
        self._in_head = True  # received bytes belong to a head not yet complete
        self._timer: Any = None  # the current request's deadline
        self._refused = False
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, "Service Unavailable", f"more than {self.limits.max_connections} open connections to "
                                                     f"the status server; close some and retry")
            return
        self._arm()  # uvicorn arms no timer until its first response: a silent client would stay

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._timer is None:
            self._arm()  # the first byte of the next request: its whole request has request_timeout
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)  # type: ignore[misc]
        self._after_feed()
        if self._in_head and self._head_bytes > self.limits.max_head_bytes and not self.transport.is_closing():
            self._refuse(431, "Request Header Fields Too Large",
                         f"the request line and headers exceed {self.limits.max_head_bytes} bytes")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    # -- what the parser subclasses call
    def _head_done(self) -> None:
        self._in_head, self._head_bytes = False, 0

    def _request_done(self) -> None:
        self._in_head, self._head_bytes = True, 0
        self._disarm()  # from here uvicorn's keep-alive timer (armed at the response's end) applies

    def _after_feed(self) -> None:
        """Update the state from the parser after it was fed (the h11 variant)."""

    # -- timers and refusals
    def _arm(self) -> None:
        self._disarm()
        self._timer = self.loop.call_later(self.limits.request_timeout, self._on_timeout)

    def _disarm(self) -> None:
        if getattr(self, "_timer", None) is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timeout(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        cycle = getattr(self, "cycle", None)
        if cycle is None or cycle.response_complete or not cycle.response_started:
            self._refuse(408, "Request Timeout", f"the request did not arrive whole within "
                                                 f"{self.limits.request_timeout:g} s")
        else:  # a response is being written (a GET answered before its body ended): just close
            self._refused = True
            self.transport.close()

    def _refuse(self, status: int, reason: str, detail: str) -> None:
        self._refused = True
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(_response(status, reason, detail))
            self.transport.close()


class _HttpToolsLimits(_Limits):
    """httptools calls these as it parses (uvicorn's protocol implements them)."""

    def on_headers_complete(self) -> None:
        self._head_done()
        super().on_headers_complete()  # type: ignore[misc]

    def on_message_complete(self) -> None:
        super().on_message_complete()  # type: ignore[misc]
        self._request_done()


class _H11Limits(_Limits):
    """h11 has no callbacks: its connection state says where the request is."""

    conn: Any

    def _after_feed(self) -> None:
        import h11

        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._in_head:
                self._head_done()
        elif state is not h11.IDLE and self._timer is not None:  # DONE, MUST_CLOSE, CLOSED, ERROR
            self._request_done()


def limited_protocol(base: type, limits: ServerLimits) -> type:
    """``base`` (uvicorn's ``HttpToolsProtocol`` or ``H11Protocol``) with ``limits`` applied
    at the transport; for ``uvicorn.Config(http=...)``."""
    mixin = _HttpToolsLimits if hasattr(base, "on_headers_complete") else _H11Limits
    return type(f"Limited{base.__name__}", (mixin, base), {"limits": limits})


class BodyLimit:
    """ASGI middleware: 413 (and the connection closes) for a request body over
    ``max_body_bytes``, whether ``Content-Length`` declares it or a chunked body grows past
    it; a smaller body is passed on whole."""

    def __init__(self, app: Any, max_body_bytes: int):
        self.app, self.max_body_bytes = app, int(max_body_bytes)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.max_body_bytes
            except ValueError:
                too_big = False  # the parser refuses a malformed length before the app runs
            if too_big:
                await self._refuse(send)
                return
            await self.app(scope, receive, send)
            return
        if b"chunked" not in headers.get(b"transfer-encoding", b"").lower():
            await self.app(scope, receive, send)  # no body
            return
        chunks, total, more = [], 0, True
        while more:  # read the chunked body while counting, then hand it on whole
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body = message.get("body", b"")
            total += len(body)
            if total > self.max_body_bytes:
                await self._refuse(send)
                return
            chunks.append(body)
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"detail": f"the request body exceeds {self.max_body_bytes} bytes (this server's "
                                     f"endpoints are GETs and need none)"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
