"""TorchRL's collectors as benchmark peers (imports torchrl; only :mod:`bench.peers` loads it,
and only when a ``torchrl_*`` peer runs).

Tested with torchrl 0.14.1 and tensordict 0.14.3 on torch 2.13 (installed with ``--no-deps``:
torchrl's compiled extension, used by its replay buffers only, does not load on this torch,
which the collectors never touch). Every collector runs the workload's own network
(:meth:`bench.workloads.Workload.make_policy`'s ``model_fn``) as a TorchRL
:class:`~torchrl.modules.ProbabilisticActor`: the network's first output is the action
distribution's parameters (``Categorical`` logits, or an ``IndependentNormal`` with the
network's ``log_std``, projected onto the action bounds with ``safe=True``), its value head runs
too, as in every other peer. Each env is the workload's gymnasium env in a
:class:`~torchrl.envs.GymWrapper` (``categorical_action_encoding=True``: integer actions, as
the env takes them).

Settings, as a careful user would pick them on a machine with ``C`` usable cores and ``N``
envs (``W = min(C, N)`` workers of ``N / W`` envs each, so no more processes than cores
contend, the layout every other multi-process peer's best case has):

==========================  ========================================================================
kind                        what runs
==========================  ========================================================================
torchrl_sync                ``Collector`` (the single-process collector, ``SyncDataCollector``
                            before 0.14) over ``ParallelEnv(W, SerialEnv(N / W, env))``: envs
                            step in ``W`` processes, the policy runs batched in the caller
torchrl_multisync           ``MultiSyncCollector`` of ``W`` workers, each a ``Collector`` over
                            ``SerialEnv(N / W, env)`` with its own copy of the policy
                            (``num_sub_threads=1``: one torch thread per worker)
torchrl_async_batched       ``AsyncBatchedCollector``: ``N`` envs in an ``AsyncEnvPool``
                            (``env_backend="multiprocessing"``, ``envs_per_worker = N / W``),
                            an ``InferenceServer`` thread of the caller batching up to ``N``
                            observations per forward pass (``transport="driver"``: the
                            ``"auto"`` process-slot transport needs one env per process, ``N``
                            processes on ``C`` cores). **Async mode**: an env steps as soon as its action is back, so a
                            batch of ``rows x N`` frames need not hold ``rows`` steps of every env
==========================  ========================================================================

The actor needs no env transform (no recurrent state), so the collectors are told not to add
TorchRL's ``InitTracker`` (``auto_register_policy_transforms=False``; 0.15 adds it by default).
Every collector yields batches of ``frames_per_batch = rows x N`` frames, endlessly
(``total_frames=-1``); one sample is the time of the next batch(es), and its env steps are
the frames the batches hold (``numel``), not the requested number.
"""
from __future__ import annotations

import os
import time
import warnings
from typing import Any, Callable

KINDS = ("torchrl_sync", "torchrl_multisync", "torchrl_async_batched")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def layout(num_envs: int, cores: int | None = None) -> tuple[int, int]:
    """``(workers, envs per worker)``: as many workers as cores (at most one per env), each
    with an equal share; the largest divisor of ``num_envs`` not above that.

    >>> layout(16, 2), layout(8, 16), layout(6, 4)
    ((2, 8), (8, 1), (3, 2))
    """
    cap = min(cores or _cores(), num_envs)
    workers = max(d for d in range(1, cap + 1) if num_envs % d == 0)
    return workers, num_envs // workers


class GymEnvFn:
    """A picklable factory of one TorchRL env around a zero-argument gymnasium factory.

    Its attribute is not called ``fn``: TorchRL's ``CloudpickleWrapper`` copies the wrapped
    callable's ``__dict__`` onto itself (``functools.update_wrapper``), so an ``fn`` attribute
    would replace the wrapper's own and the worker would call the gymnasium factory."""

    def __init__(self, gym_fn: Callable[[], Any]):
        self.gym_fn = gym_fn

    def __call__(self) -> Any:
        from torchrl.envs import GymWrapper

        return GymWrapper(self.gym_fn(), categorical_action_encoding=True)


class SerialEnvFn:
    """A picklable factory of ``SerialEnv(k, GymEnvFn(fn))`` (one worker's share of envs)."""

    def __init__(self, gym_fn: Callable[[], Any], count: int):
        self.gym_fn, self.count = gym_fn, count  # not ``fn``: see GymEnvFn

    def __call__(self) -> Any:
        from torchrl.envs import SerialEnv

        return SerialEnv(self.count, GymEnvFn(self.gym_fn))


def _dist_params_module(model_fn: Callable[[], Any], continuous: bool, obs_dims: int) -> Any:
    """The workload's network with its outputs as a distribution's parameters and the value."""
    import torch
    from torch import nn

    class DistParams(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model_fn()

        def forward(self, obs: torch.Tensor):
            # The network takes (batch, *obs_shape); a nested batched env gives (workers,
            # envs per worker, *obs_shape) and a single env (*obs_shape): flatten, then restore.
            lead = obs.shape[:obs.dim() - obs_dims]
            out, value = self.net(obs.reshape(-1, *obs.shape[len(lead):]))
            out, value = out.reshape(*lead, out.shape[-1]), value.reshape(*lead, 1)
            if continuous:
                return out, self.net.log_std.exp().expand_as(out), value
            return out, value

    return DistParams


class ActorFactory:
    """A picklable factory of the TorchRL actor for a workload (``policy_factory`` takes one;
    the ``policy`` argument gets one instance)."""

    def __init__(self, model_fn: Callable[[], Any], action_space: Any, obs_dims: int):
        self.model_fn, self.action_space, self.obs_dims = model_fn, action_space, obs_dims

    def __call__(self) -> Any:
        import gymnasium as gym
        import torch
        from tensordict.nn import TensorDictModule
        from torchrl.data import Bounded, Categorical as CategoricalSpec
        from torchrl.modules import ProbabilisticActor
        from torchrl.modules.distributions import IndependentNormal

        continuous = not isinstance(self.action_space, gym.spaces.Discrete)
        cls = _dist_params_module(self.model_fn, continuous, self.obs_dims)
        if continuous:
            keys = ["loc", "scale"]
            spec = Bounded(low=torch.as_tensor(self.action_space.low), high=torch.as_tensor(self.action_space.high),
                           shape=self.action_space.shape)
            dist = IndependentNormal
        else:
            keys = ["logits"]
            spec = CategoricalSpec(int(self.action_space.n), dtype=torch.int64)
            dist = torch.distributions.Categorical
        module = TensorDictModule(cls(), in_keys=["observation"], out_keys=keys + ["state_value"])
        return ProbabilisticActor(module, in_keys=keys, spec=spec, distribution_class=dist, safe=continuous,
                                  return_log_prob=False)


class TorchRLRunner:
    """One of :data:`KINDS` on ``workload`` (see the module doc); ``run(num_steps)`` returns env
    steps per second over the next ``max(1, round(num_steps / rows))`` batches."""

    def __init__(self, kind: str, workload: Any, warmup_steps: int = 0, seed: int = 0, cores: int | None = None):
        import torch

        if kind not in KINDS:
            raise ValueError(f"unknown TorchRL peer {kind!r}; choose one of {KINDS}")
        self.kind, self.n, self.rows = kind, workload.num_envs, workload.num_steps
        policy = workload.make_policy()
        env_fn = workload.one_env_fn()
        obs_dims = len(_probe_obs_shape(env_fn))
        actor = ActorFactory(policy.model_fn, policy.action_space, obs_dims)
        workers, per = layout(self.n, cores)
        fpb = self.rows * self.n
        self.settings: dict[str, Any] = {"num_envs": self.n, "frames_per_batch": fpb}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # 0.15 default changes, announced; we pass ours
            self.collector = self._build(kind, env_fn, actor, workers, per, fpb, seed)
        self.it = iter(self.collector)
        self.torch_threads = torch.get_num_threads()
        if warmup_steps:
            self.run(max(warmup_steps, self.rows))  # workers started, envs reset, one batch through

    def _build(self, kind: str, env_fn: Any, actor: ActorFactory, workers: int, per: int, fpb: int,
               seed: int) -> Any:
        from torchrl.collectors import AsyncBatchedCollector, Collector, MultiSyncCollector
        from torchrl.envs import ParallelEnv

        if kind == "torchrl_sync":
            env = ParallelEnv(workers, SerialEnvFn(env_fn, per))
            env.set_seed(seed)
            self.settings.update(collector="Collector", env=f"ParallelEnv({workers}, SerialEnv({per}, GymWrapper))")
            return Collector(env, actor(), frames_per_batch=fpb, total_frames=-1,
                             auto_register_policy_transforms=False)
        if kind == "torchrl_multisync":
            self.settings.update(collector=f"MultiSyncCollector({workers} workers)",
                                 env=f"SerialEnv({per}, GymWrapper)", num_sub_threads=1)
            c = MultiSyncCollector([SerialEnvFn(env_fn, per)] * workers, policy_factory=actor, frames_per_batch=fpb,
                                   total_frames=-1, num_sub_threads=1, auto_register_policy_transforms=False)
            c.set_seed(seed)
            return c
        self.settings.update(collector="AsyncBatchedCollector (async mode)", env_backend="multiprocessing",
                             envs_per_worker=per, max_batch_size=self.n)
        return AsyncBatchedCollector([GymEnvFn(env_fn)] * self.n, policy_factory=actor, frames_per_batch=fpb,
                                     total_frames=-1, env_backend="multiprocessing", envs_per_worker=per,
                                     max_batch_size=self.n, transport="driver")

    def run(self, num_steps: int) -> float:
        batches = max(1, round(num_steps / self.rows))
        t0 = time.perf_counter()
        frames = sum(next(self.it).numel() for _ in range(batches))
        return frames / (time.perf_counter() - t0)

    def close(self) -> None:
        import torch

        self.collector.shutdown()
        torch.set_num_threads(self.torch_threads)  # TorchRL's batched envs may change the caller's count


def _probe_obs_shape(env_fn: Callable[[], Any]) -> tuple[int, ...]:
    env = env_fn()
    try:
        return tuple(env.observation_space.shape)
    finally:
        env.close()


def unavailable() -> str | None:
    """Why the TorchRL peers cannot run here, or None."""
    import importlib.util

    if importlib.util.find_spec("torchrl") is None or importlib.util.find_spec("tensordict") is None:
        return ("torchrl is not installed (pip install --no-deps torchrl==0.14.1 tensordict==0.14.3 pyvers hoptorch "
                "orjson importlib_metadata: torch stays as it is)")
    return None


def versions() -> str:
    import tensordict
    import torchrl

    return f"torchrl {torchrl.__version__}, tensordict {tensordict.__version__}"

