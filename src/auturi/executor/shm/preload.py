"""Imported once by the forkserver, before it forks any worker: pins BLAS/OpenMP pools to
one thread (env workers must not oversubscribe; replicas set torch's own count) and loads
what every worker needs, so each fork starts warm. Must not import torch.

It also makes the forkserver's children start with SIGINT ignored: the forkserver hands each
child the SIGINT handler it had before its own (which ignores SIGINT), and Ctrl-C reaches
the whole process group, so a child still unpickling its arguments printed a
KeyboardInterrupt traceback before ``worker_main`` could ignore SIGINT itself. The caller
handles Ctrl-C and ends its workers.

And it shows each distinct warning once across all the workers it forks, not once per
worker: ``auturi tune HalfCheetah-v4`` printed MuJoCo's deprecation warning 50 times, once per
worker start. The forkserver maps an anonymous shared page and a lock before forking; every
child inherits both (no name in /dev/shm, gone with the last process) and records there a
hash of each warning it shows (category and text), skipping those another worker showed.
The caller's own warnings, and those of the second (torch) forkserver's children, are
counted apart: a warning shows at most once from each.

Last, a forkserver leaves without tearing its interpreter down: it exits once its last client
(the caller and every worker it forked) is gone, and with torch imported the teardown took 0.8-1 s
of a core (3-5 s on a loaded 2-core machine) after a SIGKILLed caller's workers had long left;
with ``os._exit`` at the end of its exit handlers, 0.03-0.08 s."""
import atexit
import hashlib
import mmap
import multiprocessing
import os
import struct
import sys
import warnings

from auturi._forkserver_signals import forkserver_frame

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"


def _use_callers_path(frame: object) -> None:
    """Take the caller's ``sys.path``, which ``forkserver.main`` is handed as ``sys_path`` but
    does not apply (Python 3.11): the modules it preloads after us, an env module beside the
    training script, were not found when the script ran from another directory, and each
    env worker imported the module itself (one importing torch: 9.3 s to wrap and learn
    against 2.1 s, 2026-11-27). Each child applies it again (``spawn.prepare``)."""
    paths = getattr(frame, "f_locals", {}).get("sys_path")
    if paths:
        sys.path[:] = list(paths) + [p for p in sys.path if p not in paths]


_main = forkserver_frame()  # SIGINT is ignored here already: auturi._forkserver_signals
if _main is not None:
    _use_callers_path(_main)
del _main

import gymnasium  # noqa: E402,F401
import numpy  # noqa: E402,F401

import auturi.executor.shm.worker  # noqa: E402,F401


_SLOT = 8  # bytes per warning hash; slot 0 holds the count
_SLOTS = mmap.PAGESIZE // _SLOT - 1


class _SharedWarnings:
    """The table of warnings shown by any child of this forkserver (see the module docstring)."""

    def __init__(self) -> None:
        self.page = mmap.mmap(-1, mmap.PAGESIZE)  # MAP_SHARED | MAP_ANONYMOUS: shared with forked children
        # a fork-context lock is unlinked at once: nothing of it is left in /dev/shm
        self.lock = multiprocessing.get_context("fork").Lock()
        self.show = warnings.showwarning

    def first_time(self, message: object, category: type) -> bool:
        """Whether no child has shown this warning yet; records it. A full table shows all."""
        key = hashlib.blake2b(f"{category.__name__}: {message}".encode(), digest_size=_SLOT).digest()
        with self.lock:
            (count,) = struct.unpack_from("q", self.page, 0)
            seen = self.page[_SLOT:_SLOT * (count + 1)]
            if any(seen[i:i + _SLOT] == key for i in range(0, len(seen), _SLOT)):
                return False
            if count < _SLOTS:
                self.page[_SLOT * (count + 1):_SLOT * (count + 2)] = key
                struct.pack_into("q", self.page, 0, count + 1)
            return True

    def showwarning(self, message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 - stdlib's
        if self.first_time(message, category):
            self.show(message, category, filename, lineno, file, line)


def _exit_now(server: int) -> None:
    """The forkserver's last exit handler (registered before its other preloads, so it runs
    after theirs): leave without the module teardown. Children inherit the handler but never
    run exit handlers (multiprocessing ends them by ``os._exit``); a process an env forks would,
    hence the pid check."""
    if os.getpid() == server:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or broken stream: nothing left to save
                pass
        os._exit(0)


if forkserver_frame() is not None:
    warnings.showwarning = _SharedWarnings().showwarning
    atexit.register(_exit_now, os.getpid())
