"""The ``shm`` backend: actors, env workers and policy replicas as processes on one machine,
all bulk data in shared memory, all waits blocking on semaphores.

Process layout for a config (the caller's process is "main"), as the layout plan
(:mod:`auturi.executor.layout`) decides it:
- ``num_actors == 1``: the actor runs in main; ``num_actors > 1``: one process per actor.
- ``env_parallel_degree = d``: the envs are split in ``d`` equal shares; the actor's process
  steps the first share itself and ``d - 1`` env worker processes step the others.
- ``policies_per_actor > 1``: that many replica processes per actor; 1: inference runs in
  the actor's process.
Main creates every process and every shared block, so it alone ends and unlinks them; when
main is killed outright (SIGKILL), each worker sees it gone and exits, and the resource
tracker that main's processes share unlinks what main left (``processes.exit_with_owner``).
Workers start through ``forkserver`` (``AUTURI_START_METHOD`` may say ``spawn``): never
``fork``, which breaks CUDA and copies the caller's threads.

Modules by role: ``processes`` (starting and ending processes), ``executor``
(:class:`ShmExecutor`), ``worker`` (what runs in each process), ``channel`` (the control
block and semaphores), ``forkservers`` and ``preload`` (warm process starts).
"""
from __future__ import annotations

from auturi.executor.shm.channel import Semaphore
from auturi.executor.shm.executor import ShmExecutor
from auturi.executor.shm.processes import get_context, start_without_main

__all__ = ["ShmExecutor", "Semaphore", "get_context", "start_without_main"]
