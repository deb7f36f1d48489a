"""How an env worker of the ``shm`` backend waits for its next row in the lockstep loop
(``worker._serve_rows``): polling first, or blocking at once when the layout's processes
outnumber the cores (:func:`row_spin`)."""
from __future__ import annotations

import os

from auturi.executor.buffers import ArrayBlock

USABLE_CORES = 0
"""The cores this process could run on when it started, before any pin (0: not known)."""


def remember_cores() -> None:
    """Called by a worker as it starts, before it is pinned to a core."""
    global USABLE_CORES
    USABLE_CORES = usable_cores()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 0


def live_processes(ctrl: ArrayBlock) -> int:
    """The caller and the workers of the control block that are alive (their pid words; a
    worker of an earlier layout that ended left its pid behind, hence the check)."""
    n = 1
    for pid in ctrl["pid"].tolist():
        if pid > 0:
            try:
                os.kill(pid, 0)
                n += 1
            except OSError:
                pass
    return n


def row_spin(ctrl: ArrayBlock, spin: float, cores: int | None = None) -> float:
    """How long an env worker polls for its next row in the lockstep loop: ``spin`` while the
    layout's processes fit the cores, 0 (block at once) when they outnumber them.

    Outnumbered, a worker that polls between rows only takes turns with the ones that have
    work: each poll's ``sched_yield`` hands its core to the next runnable process, which is
    as often another idle poller (it has used less CPU, so the scheduler prefers it) as the
    worker with a row to step. Counted with ``python -m bench.rowcount`` (CartPole, one env
    per process, 2 cores, load 4-10): at degree 16 the workers' context switches per row fell
    from 58-72 to 15-16 (one block a row each) and their CPU per row from 733-1006 us to
    400-513 us, and rows took 0.4-0.7x the time; at degree 4-8 likewise. Blocking costs the
    caller a futex wake per worker and row, less than the polls cost everyone."""
    cores = USABLE_CORES if cores is None else cores
    if cores and live_processes(ctrl) > cores:
        return 0.0
    return spin
