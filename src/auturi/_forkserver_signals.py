"""Imported first by ``auturi/__init__.py``: in one of Auturi's forkservers, ignore SIGINT
before anything else is imported.

A forkserver is in the terminal's process group, so a Ctrl-C reaches it too, and one landing
while it imported its preloads (the ``auturi`` package, gymnasium, torch: seconds) printed a
``KeyboardInterrupt`` traceback beside the caller's clean "interrupted" and killed the server
(2 of 7 timings of ``auturi tune`` at start-up, 2026-11-27). Its own handler ignores SIGINT
once its preloads are in, as the workers it forks do (the caller ends them); this starts that
as soon as the first preload imports this package. Setting it in the caller around the
server's start (an ignored signal survives the exec) dropped the caller's own Ctrl-C when it
landed then. Cheap (a walk up the importing frames), and nothing in any other process.
"""
import signal
import sys


def forkserver_frame() -> object | None:
    """The frame of ``multiprocessing.forkserver.main`` importing us, None when that is not
    what imports us (never in the user's process)."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_globals.get("__name__") == "multiprocessing.forkserver":
            return frame
        frame = frame.f_back
    return None


if forkserver_frame() is not None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
