"""Imported once by the forkserver, before it forks any worker: pins BLAS/OpenMP pools to
one thread (env workers must not oversubscribe; replicas set torch's own count) and loads
what every worker needs, so each fork starts warm. Must not import torch.

It also makes the forkserver's children start with SIGINT ignored: the forkserver hands each
child the SIGINT handler it had before its own (which ignores SIGINT), and Ctrl-C reaches
the whole process group, so a child still unpickling its arguments printed a
KeyboardInterrupt traceback before ``worker_main`` could ignore SIGINT itself. The caller
handles Ctrl-C and ends its workers."""
import os
import signal
import sys

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import gymnasium  # noqa: E402,F401
import numpy  # noqa: E402,F401

import auturi.executor.shm.worker  # noqa: E402,F401


def _in_forkserver() -> bool:
    """Whether ``multiprocessing.forkserver.main`` is importing us (never the user's process)."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_globals.get("__name__") == "multiprocessing.forkserver":
            return True
        frame = frame.f_back
    return False


if _in_forkserver():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
