"""Clean-up after Ray actors: unlinking what a dead actor's processes left in /dev/shm (on
its node), and settling the calls still in flight while the executor closes."""
from __future__ import annotations

import os
import time
from typing import Any

CLOSE_SECONDS = 10.0
"""How long ``close()`` lets idle actors close their executors before killing them."""


def sweep_segments(pid: int, wait: float = CLOSE_SECONDS) -> int:
    """Once process ``pid`` has ended (waiting at most ``wait`` s), unlink the segments and
    named semaphores it created (``/dev/shm/auturi_<pid>_*``, ``sem.auturi_<pid>_*``); returns
    how many. Runs on the dead actor's node."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        except PermissionError:  # the pid was reused by someone else's process
            break
        time.sleep(0.05)
    n = 0
    for name in os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []:
        if name.startswith((f"auturi_{pid}_", f"sem.auturi_{pid}_")):
            try:
                os.unlink(os.path.join("/dev/shm", name))
                n += 1
            except FileNotFoundError:
                pass
    return n


_sweep_task: Any = None


def sweeper() -> Any:
    """:func:`sweep_segments` as a Ray task (made once, when first needed: Ray is imported here)."""
    global _sweep_task
    if _sweep_task is None:
        import ray

        _sweep_task = ray.remote(num_cpus=0, max_retries=0)(sweep_segments)
    return _sweep_task


def settle(refs: list, timeout: float, watch: dict | None = None, ok: set | None = None) -> None:
    """Wait (at most ``timeout`` s in all) for ``refs``, swallowing their errors (they are
    expected while closing, and Ray would log them as unhandled); ``ok`` gets
    ``watch[ref]`` for each ref in ``watch`` that succeeded."""
    import ray

    if not refs:
        return
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    for ref in ready:
        try:
            ray.get(ref, timeout=0)
        except Exception:
            continue
        if watch is not None and ok is not None and ref in watch:
            ok.add(watch[ref])
