"""An emulated inference device, for developing and testing GPU-machine decisions without a GPU.

What it emulates (calibrated to the 2026-11-26 GPU record, ``../shared/data/gpu-2026-11-26/``:
one H200, 16 cores, the Nature CNN on 4x84x84 Pong frames; numbers at ``time_scale`` 1):

- a forward pass on the device that takes wall time growing with the batch but no CPU of
  the caller: a ``time.sleep`` of ``latency + per_row * batch`` (``h200-nature-cnn``: 0.42 ms
  + 4.4 us per row, a fit of the record's CUDA timings, 0.44-0.70 ms for batches 1-64). The
  caller blocks meanwhile, as a CUDA synchronise does, so a policy in the actor's own process
  stalls its env stepping and replicas in processes of their own pay off;
- a start cost per process, as CUDA's context: ``context_seconds`` (default 2.5 s) slept once
  per process, at the first ``to("cuda")`` or ``act`` there. The record has no direct
  timing; its first CUDA trial's reconfigure took 3.52 s for two actor processes with an
  in-process CUDA policy plus 30 env workers, and later trials starting ~31 env workers took
  0.64-1.0 s, so CUDA's start was about 2.5-3 s;
- inference on the CPU (the same policy on device ``cpu``): computed (a spin that burns the
  calling core) for 0.5 ms + 30 us per row (the record's 16-thread CPU timings: 0.45 ms at
  batch 1, 2.45 ms at 64).

The actions are a deterministic function of each row's observation and noise alone (a
categorical over six logits picked by a hash of the frame), with ``values`` and ``log_probs``
extras as PPO's, so every layout collects the same data. The policy never imports torch.

What it does not emulate: the host CPU a real CUDA call takes (the record's CUDA calls used
their calling core for their whole wall time, launching and synchronising; here they sleep);
CPU inference sharing the cores with the env workers (on the GPU box its 16 threads competed
with 16 busy env workers, which made it 3.3x slower than CUDA in the same layout; here env
workers wait, so the emulated CPU inference looks better than it was there); transfer time
that grows with the observations' bytes (folded into ``per_row``); memory of the device; a
device shared by several processes (each process's forward passes run as if it had the device
alone; on a real GPU, processes time-slice it).

How the tuner sees the device: :func:`emulated_gpu` makes this process count ``count`` CUDA
devices while its ``with`` block runs, so ``policy_device="cuda"`` validates, the tuner's
space offers ``cuda`` beside ``cpu`` and its CUDA rules apply (one torch thread per replica,
at most 8 CUDA replicas), and cached tuning records name an emulated GPU. Outside the block
nothing changes: on a machine without CUDA, ``policy_device="cuda"`` is refused as always,
so the emulation is never a path a user selects by accident. Only this process's view
changes (workers never check devices: they call ``policy.to(device)``, which this policy
handles itself). Not covered: the ``ray`` backend (Ray counts its GPUs itself) and the
``auturi`` command (a process of its own, outside any block).

Example:
    >>> import numpy as np
    >>> p = EmulatedDevicePolicy(time_scale=0.01, context_seconds=0.0)
    >>> p.forward_seconds(64, "cuda") > p.forward_seconds(1, "cuda")
    True
    >>> actions, extras = p.act(np.zeros((3, 4, 84, 84), np.uint8), np.full((3, 1), 0.5, np.float32))
    >>> actions.shape, sorted(extras)
    ((3,), ['log_probs', 'values'])
"""
from __future__ import annotations

import contextlib
import importlib
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from auturi.errors import AuturiError
from auturi.testing.emulated_sim import wait_until


@dataclass(frozen=True)
class DeviceProfile:
    """Forward-pass costs of the emulated policy (seconds at ``time_scale`` 1)."""

    name: str
    device_latency: float
    """Fixed wall time of one forward pass on the emulated device."""
    device_per_row: float
    """Wall time per observation of the batch on the device."""
    cpu_latency: float
    """Fixed CPU time of one forward pass on device ``cpu`` (computed, not waited)."""
    cpu_per_row: float
    context_seconds: float
    """The device's start cost, once per process."""


DEVICE_PROFILES: dict[str, DeviceProfile] = {p.name: p for p in [
    DeviceProfile("h200-nature-cnn", device_latency=0.42e-3, device_per_row=4.4e-6,
                  cpu_latency=0.5e-3, cpu_per_row=30e-6, context_seconds=2.5),
]}
"""Named device profiles (see the module's docstring for the calibration)."""

EMULATED_GPU_NAME = "emulated GPU (auturi.testing.emulated_gpu)"
"""What tuning records made under :func:`emulated_gpu` list as the machine's GPUs."""

# --------------------------------------------------------------------------- the start cost
_context_paid: list[int] = []  # pids of the processes that paid the start cost (a fork copies the list)


def context_payments(pid: int | None = None) -> int:
    """How many times process ``pid`` (default: this one) paid the device's start cost
    (0 or 1: it is paid once per process, whatever the number of policy objects)."""
    pid = os.getpid() if pid is None else pid
    return _context_paid.count(pid)


def _start_context(seconds: float) -> None:
    pid = os.getpid()
    if pid in _context_paid:
        return
    time.sleep(seconds)  # a CUDA context start: the process waits on the driver
    _context_paid.append(pid)


# --------------------------------------------------------------------------- the policy
class EmulatedDevicePolicy:
    """An :class:`auturi.Policy` whose forward pass costs what ``profile``'s device (or CPU)
    would, for ``num_actions`` discrete actions; see the module's docstring.

    ``time_scale`` multiplies every forward cost (not the start cost: ``context_seconds``,
    default the profile's). ``report_process=True`` adds extras ``device_pid`` (the process that
    ran the row) and ``context_payments`` (its count of start costs), for tests only: they
    differ between layouts."""

    noise_dim = 1
    needs_torch = False
    load_state_copies = True  # load_state copies both arrays and keeps nothing it gets

    def __init__(self, num_actions: int = 6, profile: str | DeviceProfile = "h200-nature-cnn",
                 time_scale: float = 1.0, context_seconds: float | None = None, report_process: bool = False,
                 seed: int = 0):
        if isinstance(profile, str):
            try:
                profile = DEVICE_PROFILES[profile]
            except KeyError:
                raise ValueError(f"unknown device profile {profile!r}; choose one of {sorted(DEVICE_PROFILES)}") \
                    from None
        self.profile = profile
        self.num_actions = int(num_actions)
        self.time_scale = float(time_scale)
        self.context_seconds = profile.context_seconds if context_seconds is None else float(context_seconds)
        self.report_process = report_process
        self.device = "cpu"
        rng = np.random.default_rng(seed)
        self._logits = rng.normal(0.0, 1.0, (16, self.num_actions)).astype(np.float32)
        self._values = rng.normal(0.0, 1.0, 16).astype(np.float32)

    def forward_seconds(self, batch: int, device: str | None = None) -> float:
        """What one forward pass of ``batch`` observations costs on ``device`` (default: the
        policy's): wall time on the emulated device, CPU time on ``cpu``."""
        p, dev = self.profile, device or self.device
        if dev == "cpu":
            return (p.cpu_latency + p.cpu_per_row * batch) * self.time_scale
        return (p.device_latency + p.device_per_row * batch) * self.time_scale

    def to(self, device: str) -> None:
        if device != "cpu" and not device.startswith("cuda"):
            raise ValueError(f"EmulatedDevicePolicy runs on 'cpu' or 'cuda[:k]', not {device!r}")
        self.device = device
        if device != "cpu":
            _start_context(self.context_seconds)

    def get_state(self) -> dict[str, np.ndarray]:
        return {"logits": self._logits.copy(), "values": self._values.copy()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self._logits = np.asarray(state["logits"], np.float32).copy()
        self._values = np.asarray(state["values"], np.float32).copy()

    def act(self, obs: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        t0 = time.perf_counter()
        on_device = self.device != "cpu"
        if on_device:
            _start_context(self.context_seconds)  # a process that never called to() starts it here
            t0 = time.perf_counter()
        n = len(obs)
        flat = np.asarray(obs).reshape(n, -1)
        # A sparse sample of the row's pixels picks one of 16 logit rows: the action depends on
        # the row's observation and noise only, whatever the batch.
        k = (flat[:, -1::-397].astype(np.int64).sum(axis=1) % 16) if flat.shape[1] else np.zeros(n, np.int64)
        logits = self._logits[k]
        logp_all = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        cdf = np.exp(logp_all).cumsum(axis=1)
        a = np.minimum((cdf < noise[:, :1]).sum(axis=1), self.num_actions - 1)
        extras = {"values": self._values[k], "log_probs": logp_all[np.arange(n), a]}
        if self.report_process:
            extras["device_pid"] = np.full(n, os.getpid(), np.int64)
            extras["context_payments"] = np.full(n, context_payments(), np.int64)
        deadline = t0 + self.forward_seconds(n)
        if on_device:
            wait_until(deadline)  # the device computes; the caller waits without CPU
        else:
            spins = 0
            while time.perf_counter() < deadline:  # burns CPU on purpose: CPU inference computes
                spins += 1
        return a.astype(np.int64), extras


# --------------------------------------------------------------------------- the device count
# auturi.resources.cuda_device_count is the one reading of "how many CUDA devices" (check_device
# calls it; the tuner's space holds an alias of it). It answers resources._emulated_cuda while
# that is set: emulated_gpu() sets it (no module's binding is patched, so an alias imported
# under any name, before or during the block, sees it); the tuner's cache fingerprint, when it
# reads GPU names through cache._torch_info, lists the emulated ones.
_RESOURCES = "auturi.resources"
_INFO = ("auturi.tuner.cache", "_torch_info")
_active: list[int] = []


def emulated_gpu_count() -> int:
    """The emulated CUDA devices this process counts now (0 outside :func:`emulated_gpu`)."""
    return _active[-1] if _active else 0


@contextlib.contextmanager
def emulated_gpu(count: int = 1) -> Iterator[None]:
    """While the block runs, this process counts ``count`` CUDA devices: ``Config``'s
    ``policy_device="cuda"`` validates in :func:`auturi.make_executor` and the tuner's space
    offers ``cuda``. Use it with :class:`EmulatedDevicePolicy` (a real torch policy moved to an
    emulated ``cuda`` would fail in its workers). Nests; restores everything on exit.

    >>> from auturi.resources import check_device
    >>> with emulated_gpu():
    ...     check_device("cuda")
    'cuda'
    >>> emulated_gpu_count()
    0
    """
    if count < 1:
        raise ValueError(f"emulated_gpu needs count >= 1, not {count}")
    resources = importlib.import_module(_RESOURCES)
    if not hasattr(resources, "_emulated_cuda"):
        raise AuturiError(f"emulated_gpu: {_RESOURCES}._emulated_cuda no longer exists; update "
                          f"auturi.testing.emulated_gpu to where the CUDA count is read now")
    cache = importlib.import_module(_INFO[0])
    real_info = getattr(cache, _INFO[1], None)

    def fake_info() -> tuple[str | None, list[str]]:
        version, gpus = real_info()
        return version, list(gpus) + [EMULATED_GPU_NAME] * count

    before = resources._emulated_cuda
    resources._emulated_cuda = count
    if real_info is not None:
        setattr(cache, _INFO[1], fake_info)
    _active.append(count)
    try:
        yield
    finally:
        _active.pop()
        resources._emulated_cuda = before
        if real_info is not None:
            setattr(cache, _INFO[1], real_info)


# --------------------------------------------------------------------------- the whole box
@dataclass(frozen=True)
class EmulatedBox:
    """What :func:`emulated_box` yields: ``env`` (a picklable env factory for
    :func:`auturi.make_executor`, ``auturi.tune``, SB3's VecEnvs) and ``policy()`` (a fresh
    :class:`EmulatedDevicePolicy` of the same time scale)."""

    env: Any
    profile: str
    time_scale: float
    context_seconds: float | None
    sim_cores: int | None

    def policy(self, **kw: Any) -> EmulatedDevicePolicy:
        from auturi.testing.emulated_sim import get_profile

        kw.setdefault("time_scale", self.time_scale)
        kw.setdefault("context_seconds", self.context_seconds)
        return EmulatedDevicePolicy(get_profile(self.profile).num_actions, **kw)


@contextlib.contextmanager
def emulated_box(profile: str = "pong-like", *, time_scale: float = 1.0, sim_cores: int | None = 16,
                 context_seconds: float | None = None, gpus: int = 1) -> Iterator[EmulatedBox]:
    """The emulated GPU machine in one block: ``gpus`` emulated CUDA devices
    (:func:`emulated_gpu`) and, unless ``sim_cores`` is None, a pool of that many simulator
    cores (:class:`~auturi.testing.emulated_sim.SimCores`) the envs share.

    >>> import auturi
    >>> with emulated_box("straggler", time_scale=0.01, context_seconds=0.0) as box:
    ...     cfg = auturi.Config(1, 4, 2, 1, "cuda", 4)
    ...     with auturi.make_executor(box.env, box.policy(), num_envs=4, config=cfg, backend="serial") as ex:
    ...         ex.collect(3).observations.shape
    (3, 4, 4, 84, 84)
    """
    import functools

    from auturi.testing.emulated_sim import EmulatedSimEnv, SimCores

    with contextlib.ExitStack() as stack:
        stack.enter_context(emulated_gpu(gpus))
        pool = stack.enter_context(SimCores(sim_cores)) if sim_cores else None
        env = functools.partial(EmulatedSimEnv, profile, time_scale=time_scale,
                                sim_cores=pool.name if pool is not None else None)
        yield EmulatedBox(env, profile, time_scale, context_seconds, sim_cores)
