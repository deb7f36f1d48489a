"""The uvicorn server on a daemon thread of the tuning (or training) process."""
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

from auturi.errors import AuturiError
from auturi.server.guard import is_loopback
from auturi.server.limits import ServerLimits, limited_protocol
from auturi.server.routes import create_app

class ServerError(AuturiError, ValueError):
    """The status server cannot start as asked; the message says how to fix it."""



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


def _http_protocol(limits: ServerLimits) -> type:
    """uvicorn's HTTP/1.1 protocol class (httptools' when installed, else h11's) with
    ``limits`` applied at the transport (:mod:`auturi.server.limits`)."""
    if _fast_or("httptools", "h11") == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    return limited_protocol(base, limits)


class StatusServer:
    """Serves :func:`create_app` with uvicorn on a daemon thread of this process.

    Args:
        source: an object with ``status()`` and ``trials()`` (a :class:`StatusSnapshot`, a tuner).
        host: address to bind; loopback by default. Any other address requires ``token``.
        port: TCP port; 0 picks a free one (see :attr:`port` after :meth:`start`).
        token: if set, every request must carry it (``Authorization: Bearer TOKEN`` or
            ``?token=TOKEN``) or gets 401.
        limits: what one client may hold (head and body sizes, how long a request may take to
            arrive and a connection may idle, how many connections): :class:`ServerLimits`,
            whose defaults suit a browser, curl and Prometheus.

    Raises:
        ServerError: a non-loopback ``host`` without a token, or a port that cannot be bound.
    """

    def __init__(self, source: Any, host: str = "127.0.0.1", port: int = 0, token: str | None = None, *,
                 title: str = "Auturi status", hardware: Mapping[str, Any] | None = None,
                 limits: ServerLimits | None = None):
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
        if limits is not None and not isinstance(limits, ServerLimits):
            raise TypeError(f"limits must be an auturi.server.ServerLimits, got {type(limits).__name__}")
        self.limits = limits or ServerLimits()
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
        lim = self.limits
        app = create_app(self.source, token=self.token, bound_host=self.host, hardware=hardware, title=self.title,
                         max_body_bytes=lim.max_body_bytes)
        self._sock = self._bind()
        self.port = int(self._sock.getsockname()[1])
        # uvicorn's own limits where it has them; the rest (a head's size under httptools, a
        # request's time to arrive, connections that never send one) in _http_protocol.
        # limit_concurrency counts the asking connection itself (503 at >=), hence the + 1:
        # both then allow max_connections.
        config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False, lifespan="off",
                                loop=_fast_or("uvloop", "asyncio"), http=_http_protocol(lim), ws="none",
                                timeout_keep_alive=lim.keep_alive_timeout,  # type: ignore[arg-type] - a float works
                                limit_concurrency=lim.max_connections + 1,
                                h11_max_incomplete_event_size=lim.max_head_bytes + 2**20,  # a backstop: ours is first
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
