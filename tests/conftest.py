"""Every test must leave no worker process and no shared-memory segment behind."""
from __future__ import annotations

import os

import psutil
import pytest


def our_segments(pid: int | None = None) -> set[str]:
    """Segments created by process ``pid`` (default: this one); other sessions' runs on the
    same machine make their own and must not count."""
    prefix = f"auturi_{pid or os.getpid()}_"
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}


def live_children() -> list[psutil.Process]:
    """Children of the test process, less multiprocessing's own long-lived helpers."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            continue
        if "forkserver" in cmd and "auturi" not in p.name() or "resource_tracker" in cmd:
            continue
        if p.name().startswith("auturi") or "multiprocessing" in cmd:
            out.append(p)
    return out


@pytest.fixture(autouse=True)
def no_leaks():
    before = our_segments()
    yield
    assert our_segments() - before == set(), "shared-memory segments leaked"
    left = live_children()
    assert not left, f"worker processes left running: {[(p.pid, p.name()) for p in left]}"
