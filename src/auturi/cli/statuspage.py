"""``auturi tune --status-port``: the status server fed by the tuner's events, and what
happens to it when tuning ends. A person who asked for the page in a terminal keeps it until
Ctrl-C (the final ranking and the choice stay readable); elsewhere (a pipe, a job, a test)
the run ends, and the last line says where the record of the final state is."""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

from auturi.cli.common import fail, one_line
from auturi.cli.render import say

__all__ = ["StatusPage", "interactive", "linger"]


class StatusPage:
    """The status server of ``--status-port``: a snapshot fed by the tuner's events, served
    from the moment the executor exists until :meth:`stop`."""

    def __init__(self, host: str, port: int, token: str | None, env: str | None = None):
        from auturi.server import StatusSnapshot

        self.host, self.port, self.token = host, port, token
        self.snapshot = StatusSnapshot(env=env)  # the page names the env the user typed
        self.server: Any = None
        self.tuner: Any = None

    def bind(self) -> str:
        """Start serving (phase ``idle`` until :meth:`attach`) and return the URL. ``auturi tune``
        calls it before any worker starts, so a port in use costs nothing."""
        from auturi.server import StatusServer

        if self.server is not None:
            return self.server.url
        server = StatusServer(self.snapshot, host=self.host, port=self.port, token=self.token, hardware=None)
        try:
            url = server.start()
        except Exception as e:  # noqa: BLE001 - ServerError: port in use, ...
            fail(one_line(str(e)))
        self.server = server
        return url

    def attach(self, tuner: Any) -> None:
        """Serve ``tuner``'s state from now on (its events feed the snapshot)."""
        self.tuner = tuner
        self.snapshot.attach(tuner)

    def start(self, tuner: Any) -> str:
        """:meth:`bind` (if not yet) and :meth:`attach`; returns the URL."""
        url = self.bind()
        self.attach(tuner)
        return url

    def final(self) -> None:
        if self.tuner is not None:
            self.snapshot.update(status=self.tuner.status(), trials=self.tuner.trials())

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def interactive() -> bool:
    """A person at a terminal: stdin and stdout are both a TTY (not a pipe, a file or a job)."""
    try:
        return sys.stdin.isatty() and sys.stdout.isatty()
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


def linger(url: str, seconds: float | None, record: Path | None, err: Any) -> None:
    """After tuning, keep the status page up ``seconds`` (None: until Ctrl-C when a person
    runs this in a terminal, else not at all), and say so; when it stops with the run, say
    where the record of what it showed is. Sleeps in the main thread, so Ctrl-C ends it."""
    if seconds is None:
        seconds = math.inf if interactive() else 0.0
    if seconds > 0:
        until = "until Ctrl-C" if math.isinf(seconds) else f"for {seconds:g} more s (Ctrl-C to stop)"
        say(err, f"Tuning done; the status page stays up at {url} {until}")
        end = time.monotonic() + seconds
        try:
            while (left := end - time.monotonic()) > 0:
                time.sleep(min(left, 3600.0))  # in slices: time.sleep(inf) raises OverflowError
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (raised as Terminated while tuning's handler stands)
            pass  # tuning is done: the signal only ends the linger, and the run exits 0
        return
    kept = (f"its final state is the record {record} (auturi show {record})" if record is not None
            else "write a record with --out PATH to keep its final state")
    say(err, f"The status page at {url} stopped with the run; {kept}; --status-linger S keeps the page up S "
             f"seconds after tuning (inf: until Ctrl-C)")
