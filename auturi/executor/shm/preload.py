"""Imported once by the forkserver, before it forks any worker: pins BLAS/OpenMP pools to
one thread (env workers must not oversubscribe; replicas set torch's own count) and loads
what every worker needs, so each fork starts warm. Must not import torch."""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import gymnasium  # noqa: E402,F401
import numpy  # noqa: E402,F401

import auturi.executor.shm.worker  # noqa: E402,F401
