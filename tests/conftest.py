"""Every test must leave no worker process and no shared-memory segment behind."""
from __future__ import annotations

import logging
import multiprocessing.resource_tracker as resource_tracker
import os

import psutil
import pytest

_created_semaphores: set[str] = set()  # names of every named semaphore this process created
_register = resource_tracker.register


def _record_register(name: str, rtype: str) -> None:
    """multiprocessing registers each named semaphore it creates with its resource tracker
    (``synchronize.SemLock`` looks ``register`` up at each creation): note the name, whoever
    chose it, so a leak is seen even under multiprocessing's own ``mp-*`` names."""
    if rtype == "semaphore":
        _created_semaphores.add(name.lstrip("/"))
    _register(name, rtype)


resource_tracker.register = _record_register


@pytest.fixture(autouse=True, scope="session")
def _sb3_logs_in_one_folder(tmp_path_factory):
    """SB3's logger makes a ``tempdir/SB3-<date>`` folder per ``learn()`` unless told where
    (``SB3_LOGDIR``, read by the test processes and the scripts they start): one folder of the
    test session's, removed with its temporary files, instead of thousands left in /tmp."""
    old = os.environ.get("SB3_LOGDIR")
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3_logs"))
    yield
    if old is None:
        os.environ.pop("SB3_LOGDIR", None)
    else:
        os.environ["SB3_LOGDIR"] = old


def our_segments(pid: int | None = None) -> set[str]:
    """Segments and named semaphores created by process ``pid`` (default: this one; their names
    carry it: ``auturi_<pid>_*``, ``sem.auturi_<pid>_*``) and, for this process, every named
    semaphore it registered; other sessions' runs on the same machine make their own and must
    not count."""
    pid = pid or os.getpid()
    prefixes = (f"auturi_{pid}_", f"sem.auturi_{pid}_")
    names = set(os.listdir("/dev/shm"))
    found = {n for n in names if n.startswith(prefixes)}
    if pid == os.getpid():
        found |= {f"sem.{n}" for n in _created_semaphores if f"sem.{n}" in names}
    return found


def live_children() -> list[psutil.Process]:
    """Children of the test process, less multiprocessing's own long-lived helpers."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:  # a process that ends while we read it is not left running
            cmd = " ".join(p.cmdline())
            name = p.name()
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            continue
        if "forkserver" in cmd and "auturi" not in name or "resource_tracker" in cmd:
            continue
        if name.startswith("auturi") or "multiprocessing" in cmd:
            out.append(p)
    return out


@pytest.fixture(autouse=True)
def no_leaks():
    before = our_segments()
    yield
    assert our_segments() - before == set(), "shared-memory segments or named semaphores leaked"
    left = live_children()
    assert not left, f"worker processes left running: {[(p.pid, ' '.join(p.cmdline()[:3])) for p in left if p.is_running()]}"


@pytest.fixture(scope="module")
def ray_local():
    """A small local Ray instance for one test module, skipped only when Ray is not installed.
    8 logical CPUs: Ray only counts them (this machine may have 2 cores), and an actor of the
    contract's configs asks for up to 5 (its processes)."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING, object_store_memory=80 * 2**20)
    yield ray
    ray.shutdown()
