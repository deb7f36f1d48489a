"""This machine's resources, as Auturi counts them: the cores this process may run on and
the CUDA devices torch sees; and a Ray cluster's (:class:`ClusterResources`).

One definition for every module that needs them (the ``shm`` backend's pins and policy
threads, the Ray backend's local instance size, the tuner's space, profile and cache key):
"usable" means this process's affinity mask, not the machine's core count, so a job started
under ``taskset`` or a container CPU set plans for the cores it really has.

Example:
    >>> from auturi.resources import usable_cores, usable_cores_set
    >>> usable_cores() == len(usable_cores_set()) >= 1
    True
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from auturi.config import Config
from auturi.errors import AuturiError


def usable_cores_set() -> set[int]:
    """Ids of the cores this process may run on (its affinity mask; every core off Linux)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores this process may run on (see :func:`usable_cores_set`)."""
    return len(usable_cores_set())


def cuda_device_count() -> int:
    """CUDA devices torch sees; 0 without torch or without a usable GPU.

    torch is imported here, only when asked: building a plan or a space for a CPU-only
    workload must not import it, and env workers never call this."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@dataclass(frozen=True)
class ClusterResources:
    """CPUs and GPUs of each alive node of a Ray cluster (see :func:`ray_cluster_resources`).

    >>> c = ClusterResources(node_cpus=(4, 2))
    >>> c.total_cpus, c.actors_that_fit(Config(num_actors=3, envs_per_actor=2, env_parallel_degree=2))
    (6, 3)
    """

    node_cpus: tuple[int, ...]
    node_gpus: tuple[int, ...] = ()

    @property
    def total_cpus(self) -> int:
        return sum(self.node_cpus)

    @property
    def total_gpus(self) -> int:
        return sum(self.node_gpus)

    def actors_that_fit(self, config: Config) -> int:
        """How many actors of ``config`` the nodes hold (an actor's processes share a node)."""
        procs = config.processes_per_actor
        gpus = self.node_gpus or (0,) * len(self.node_cpus)
        if config.policy_device == "cpu":
            return sum(c // procs for c in self.node_cpus)
        return sum(min(c // procs, int(g)) for c, g in zip(self.node_cpus, gpus))

    def problem(self, config: Config) -> str | None:
        """Why the cluster cannot run ``config`` (one CPU per process, one GPU per actor
        with a CUDA policy), or None."""
        found = self.knob_problem(config)
        return found[1] if found else None

    def knob_problem(self, config: Config) -> tuple[str, str] | None:
        """:meth:`problem` with the knob to change: ``(knob, reason)`` or None."""
        procs = config.processes_per_actor
        biggest = max(self.node_cpus, default=0)
        if procs > biggest:
            return ("env_parallel_degree", f"an actor runs {procs} processes but the largest node has {biggest} "
                                           f"CPUs (an actor cannot span nodes)")
        if config.policy_device != "cpu" and not self.total_gpus:
            return "policy_device", "no GPU in the Ray cluster"
        fits = self.actors_that_fit(config)
        if fits < config.num_actors:
            need = f"{procs} CPUs" + (" and a GPU" if config.policy_device != "cpu" else "")
            return ("num_actors", f"{config.num_actors} actors of {need} each do not fit the cluster's nodes "
                                  f"(CPUs {list(self.node_cpus)}, GPUs {list(self.node_gpus)}): {fits} fit")
        return None


def ray_cluster_resources() -> ClusterResources:
    """The alive nodes' CPUs and GPUs of the Ray cluster this process is connected to
    (Ray is imported here, only when asked)."""
    import ray

    if not ray.is_initialized():
        raise AuturiError("not connected to a Ray cluster: call ray.init(...) or make a ray executor first")
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return ClusterResources(tuple(int(n["Resources"].get("CPU", 0)) for n in nodes),
                            tuple(int(n["Resources"].get("GPU", 0)) for n in nodes))
