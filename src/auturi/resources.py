"""This machine's resources, as Auturi counts them: the cores this process may run on and
the CUDA devices torch sees; and a Ray cluster's (:class:`ClusterResources`). Whether a policy
device exists is checked here, once (:func:`check_device`), for the executor, the tuner's
space, the command line and the Ray backend.

One definition for every module that needs them (the ``shm`` backend's pins and policy
threads, the Ray backend's local instance size, the tuner's space, profile and cache key):
"usable" means this process's affinity mask, not the machine's core count, so a job started
under ``taskset`` or a container CPU set plans for the cores it really has; and no more than its
cgroup's CPU quota allows (:func:`cpu_quota`: ``docker run --cpus=4``, a Kubernetes CPU limit),
where the mask still lists every core of the host.

Example:
    >>> from auturi.resources import usable_cores, usable_cores_set
    >>> 1 <= usable_cores() <= len(usable_cores_set())
    True
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from auturi.config import DEVICE_PATTERN, Config
from auturi.errors import AuturiError, ConfigError


def usable_cores_set() -> set[int]:
    """Ids of the cores this process may run on (its affinity mask; every core off Linux)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores' worth of time this process may use: its affinity mask's cores
    (:func:`usable_cores_set`), capped by its cgroup's CPU quota rounded up (:func:`cpu_quota`).
    A container limited to 4 CPUs on a 64-core host sees all 64 in its mask; planning for them
    gave each CPU replica ~60 torch threads and the tuner a space of hundreds of processes, all
    throttled to 4 cores' time."""
    cores = len(usable_cores_set())
    quota = cpu_quota()
    return cores if quota is None else max(1, min(cores, math.ceil(quota - 1e-9)))


def cpu_quota(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> float | None:
    """CPUs' worth of time this process's cgroup (or one above it) may use per period, the
    smallest such quota: cgroup v2's ``cpu.max``, v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``;
    None without a limit, off Linux, or where the files cannot be read.

    Each file is looked for at the cgroup's path under ``root`` and above it, up to ``root``
    itself: inside a container the path ``proc_cgroup`` names is often the host's, while its
    own cgroup is mounted at ``root``.

    >>> import pathlib, tempfile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "cpu.max").write_text("250000 100000\\n"); _ = (d / "cgroup").write_text("0::/\\n")
    >>> cpu_quota(str(d), str(d / "cgroup"))
    2.5
    """
    try:
        with open(proc_cgroup, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # cgroup v2 (the unified hierarchy)
            dirs, files = [root], ("cpu.max",)
        elif "cpu" in controllers.split(","):  # cgroup v1's cpu controller, mounted under its own name(s)
            dirs = [os.path.join(root, name) for name in (controllers, "cpu", "cpu,cpuacct")]
            files = ("cpu.cfs_quota_us",)
        else:
            continue
        for base in dict.fromkeys(dirs):
            rel = path.strip("/")
            while True:
                q = _read_quota(os.path.join(base, rel) if rel else base, files[0])
                if q is not None:
                    found.append(q)
                if not rel:
                    break
                rel = os.path.dirname(rel)
    return min(found) if found else None


def _read_quota(folder: str, name: str) -> float | None:
    """The quota in CPUs that ``folder/name`` sets (None: no limit, or no such file)."""
    try:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            text = f.read().split()
        if name == "cpu.max":  # "max 100000" or "QUOTA PERIOD"
            quota, period = text[0], (text[1] if len(text) > 1 else "100000")
        else:
            with open(os.path.join(folder, "cpu.cfs_period_us"), encoding="utf-8") as f:
                quota, period = text[0], f.read().strip()
        if quota == "max" or int(quota) <= 0 or int(period) <= 0:  # v1 writes -1 for no limit
            return None
        return int(quota) / int(period)
    except (OSError, ValueError, IndexError):
        return None


_emulated_cuda: int | None = None
"""While set, the CUDA devices :func:`cuda_device_count` answers instead of torch's: set only by
:func:`auturi.testing.emulated_gpu.emulated_gpu` (tests and benches), never by a user path.
One global read at call time, so every module that counts devices (the executor's check, the
tuner's space, the SB3 face) sees the emulation, whatever name it imported the function by."""


def cuda_device_count() -> int:
    """CUDA devices torch sees; 0 without torch or without a usable GPU (the emulated count
    while :data:`_emulated_cuda` is set).

    torch is imported here, only when asked: building a plan or a space for a CPU-only
    workload must not import it, and env workers never call this."""
    if _emulated_cuda is not None:
        return _emulated_cuda
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_device(device: str, cuda_count: int | None = None, *, where: str = "here",
                 use_cpu: str = "policy_device='cpu'") -> str:
    """``device`` (``cpu``, ``cuda``, ``cuda:k``) when it exists, else :class:`ConfigError`
    naming the knob, the rule and the fix. The one check of a policy device: the executor, the
    tuner's space (which prunes with the error's rule), the command line and the Ray backend
    (``cuda_count``: the cluster's GPUs, ``where``: "in the Ray cluster") all call it.

    ``cuda_count``: the CUDA devices to check against (default: this machine's,
    :func:`cuda_device_count`, read only for a CUDA device); ``use_cpu``: how the caller's
    user picks the CPU instead, for the fix (the CLI says ``--devices cpu``).

    >>> check_device("cpu"), check_device("cuda:1", cuda_count=2)
    ('cpu', 'cuda:1')
    >>> check_device("cuda:2", cuda_count=2)
    Traceback (most recent call last):
    ...
    auturi.errors.ConfigError: policy_device='cuda:2' is invalid: cuda:2 does not exist here: 2 CUDA device(s), cuda:0..cuda:1
    """
    if not isinstance(device, str) or not DEVICE_PATTERN.match(device):
        raise ConfigError("policy_device", device, "must be 'cpu', 'cuda' or 'cuda:k'")
    if device == "cpu":
        return device
    count = cuda_device_count() if cuda_count is None else int(cuda_count)
    if not count:
        if where == "here":
            rule = (f"no CUDA device here (torch.cuda.is_available() is False); use {use_cpu}, or install a CUDA "
                    f"build of torch on a GPU machine")
        else:
            rule = f"no GPU {where}; use {use_cpu}, or add a node with a GPU"
        raise ConfigError("policy_device", device, rule)
    idx = int(device.split(":")[1]) if ":" in device else 0
    if idx >= count:
        raise ConfigError("policy_device", device,
                          f"{device} does not exist {where}: {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    return device


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
        if config.policy_device != "cpu":
            try:
                check_device(config.policy_device, self.total_gpus, where="in the Ray cluster")
            except ConfigError as e:
                return "policy_device", e.rule
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


def ray_node_cores() -> tuple[int, ...]:
    """CPUs of each alive node of the connected Ray cluster, the caller's node first (the
    one whose actors share the caller's object store); () when not connected (or no Ray)."""
    try:
        import ray
    except ImportError:
        return ()
    if not ray.is_initialized():
        return ()
    here = ray.get_runtime_context().get_node_id()
    nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: n.get("NodeID") != here)
    return tuple(int(n.get("Resources", {}).get("CPU", 0)) for n in nodes)
