"""The systems a user would pick instead of Auturi, and Auturi itself, behind one interface:
``run(num_steps) -> env steps per second`` (``num_steps`` rows of ``num_envs`` envs) and
``close()``. Every runner collects with the policy it is given (the same network for all), in
the same loop: the policy on the current observations, then a vectorised env step.

==============  ==========================================================================
kind            what runs
==============  ==========================================================================
dummy           SB3 ``DummyVecEnv`` (envs stepped one after another in this process)
subproc         SB3 ``SubprocVecEnv`` (one process per env, pipes), started with ``fork``
async           gymnasium ``AsyncVectorEnv`` (one process per env), ``shared_memory=True``
envpool         EnvPool sync mode (``batch_size == num_envs``), C++ threads = cores
envpool_async   EnvPool async mode: ``batch_size = num_envs // 2``, policy on each batch
auturi          :class:`AuturiRunner`: an Auturi ``shm`` executor with a given config
rllib           :class:`bench.rllib_peer.RLlibRunner` (imports ray only when used)
torchrl_*       :class:`bench.torchrl_peer.TorchRLRunner` (imports torchrl only when used)
pufferlib*      :class:`bench.pufferlib_peer.PufferLibRunner` (imports pufferlib only when used)
==============  ==========================================================================

Example:
    >>> from bench.peers import PeerRunner
    >>> from auturi import ConstantPolicy
    >>> import gymnasium as gym
    >>> p = PeerRunner("dummy", lambda: gym.make("CartPole-v1"), 2, ConstantPolicy(gym.spaces.Discrete(2)))
    >>> p.run(10) > 0
    True
    >>> p.close()
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np

from bench.common import act

PEERS = ("dummy", "subproc", "async", "envpool", "envpool_async")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class PeerRunner:
    """``kind``: ``dummy``/``subproc`` (SB3), ``async`` (gymnasium, shared memory), ``envpool``
    or ``envpool_async`` (``envpool_task`` names the EnvPool task; ``env_fn`` is then unused).
    ``start_method``: SubprocVecEnv's. ``warmup_steps``: rows run (untimed) at the start."""

    def __init__(self, kind: str, env_fn: Callable[[], Any] | None, num_envs: int, policy: Any, seed: int = 0,
                 envpool_task: str | None = None, warmup_steps: int = 0, start_method: str = "fork"):
        self.kind, self.n, self.policy = kind, num_envs, policy
        self.batch = num_envs
        self.settings: dict[str, Any] = {"num_envs": num_envs}
        if kind == "dummy":
            from stable_baselines3.common.vec_env import DummyVecEnv

            self.env = DummyVecEnv([env_fn] * num_envs)
        elif kind == "subproc":
            from stable_baselines3.common.vec_env import SubprocVecEnv

            # SB3's own default is forkserver, whose workers each import torch and SB3 (seconds
            # each on 2 cores, a minute for 16 on a busy machine); the start method changes
            # only the start-up, which is not timed, so the suite forks.
            self.env = SubprocVecEnv([env_fn] * num_envs, start_method=start_method)
            self.settings["start_method"] = start_method
        elif kind == "async":
            import gymnasium as gym

            self.env = gym.vector.AsyncVectorEnv([env_fn] * num_envs, shared_memory=True)
            self.settings["shared_memory"] = True
        elif kind in ("envpool", "envpool_async"):
            import envpool

            if envpool_task is None:
                raise ValueError(f"peer {kind!r} needs envpool_task")
            if kind == "envpool_async":
                self.batch = max(1, num_envs // 2)
            threads = min(_cores(), num_envs)
            self.env = envpool.make_gymnasium(envpool_task, num_envs=num_envs, batch_size=self.batch,
                                              num_threads=threads, seed=seed)
            self.settings.update(task=envpool_task, batch_size=self.batch, num_threads=threads)
        else:
            raise ValueError(f"unknown peer {kind!r}; choose one of {PEERS}")
        if kind == "envpool_async":
            self.env.async_reset()
            self.obs, self.ids = None, None
        elif kind in ("async", "envpool"):
            self.obs, _ = self.env.reset(seed=seed) if kind == "async" else self.env.reset()
        else:
            self.env.seed(seed)
            self.obs = self.env.reset()
        self.rng = np.random.default_rng(seed)
        if warmup_steps:
            self.run(warmup_steps)

    def run(self, num_steps: int) -> float:
        """Collect ``num_steps`` rows of ``num_envs`` env steps; return env steps per second."""
        t0 = time.perf_counter()
        if self.kind == "envpool_async":
            for _ in range(num_steps * self.n // self.batch):
                obs, _, _, _, info = self.env.recv()  # the first `batch` envs to finish
                self.env.send(act(self.policy, obs, self.rng), info["env_id"])
            steps = num_steps * self.n // self.batch * self.batch
        else:
            for _ in range(num_steps):
                self.obs, *_ = self.env.step(act(self.policy, self.obs, self.rng))
            steps = num_steps * self.n
        return steps / (time.perf_counter() - t0)

    def close(self) -> None:
        self.env.close()


class AuturiRunner:
    """An Auturi ``shm`` executor with a fixed ``config``; ``run`` is one ``collect``.

    ``env`` is what :func:`auturi.make_executor` takes (a factory or an id)."""

    kind = "auturi"

    def __init__(self, env: Any, policy: Any, num_envs: int, config: Any, seed: int = 0, warmup_steps: int = 16):
        import auturi

        self.config = config
        self.ex = auturi.make_executor(env, policy, num_envs, config=config, backend="shm", seed=seed)
        if warmup_steps:
            self.ex.collect(warmup_steps)  # workers started, envs reset, first-touch faults paid

    def run(self, num_steps: int) -> float:
        r = self.ex.collect(num_steps)
        return r.stats.steps / r.stats.seconds

    def close(self) -> None:
        self.ex.close()


class LimitProbe:
    """The serial config (envs and policy in the caller, no IPC) on an Auturi ``serial``
    executor, kept to estimate this machine's limit for a workload the way ``auturi tune``
    does (:func:`auturi.tuner.api.machine_limit`): ``run`` is one collect, whose
    :class:`~auturi.CollectStats` (env and inference seconds) are kept. Sampled in the same
    interleaved rounds as the peers, so the limit and the throughputs share the machine's
    state."""

    kind = "limit"

    def __init__(self, env: Any, policy: Any, num_envs: int, seed: int = 0, warmup_steps: int = 16):
        import auturi

        self.stats: list[Any] = []
        self.num_envs = num_envs
        self.ex = auturi.make_executor(env, policy, num_envs, config=auturi.Config.serial(num_envs),
                                       backend="serial", seed=seed)
        if warmup_steps:
            self.ex.collect(warmup_steps)  # envs reset, first calls paid; not kept

    def run(self, num_steps: int) -> float:
        r = self.ex.collect(num_steps)
        self.stats.append(r.stats)
        return r.stats.steps / r.stats.seconds

    def limit(self, cores: int | None = None, profile: dict | None = None) -> dict[str, Any]:
        """:func:`auturi.tuner.api.machine_limit` of the kept collects on ``cores`` (default:
        this process's usable cores), with the tuner's ``profile`` when given."""
        from auturi.resources import usable_cores
        from auturi.tuner.api import machine_limit

        return machine_limit(self.stats, cores or usable_cores(), profile, num_envs=self.num_envs)

    def close(self) -> None:
        self.ex.close()


def peer_unavailable(kind: str, workload: Any) -> str | None:
    """Why ``kind`` cannot run ``workload`` here, or None when it can."""
    import importlib.util

    if kind in ("envpool", "envpool_async"):
        if importlib.util.find_spec("envpool") is None:
            return "envpool is not installed (pip install envpool)"
        if not workload.envpool_task:
            return f"EnvPool has no {workload.env_id}"
    if kind.startswith("rllib") and importlib.util.find_spec("ray") is None:
        return "ray[rllib] is not installed (pip install 'ray[rllib]')"
    if kind.startswith("torchrl"):
        from bench.torchrl_peer import unavailable

        return unavailable()
    if kind.startswith("pufferlib"):
        from bench.pufferlib_peer import unavailable as puffer_unavailable

        return puffer_unavailable()
    return None


def make_workload_peer(kind: str, workload: Any, warmup_steps: int = 0, **kw: Any) -> Any:
    """A runner of ``kind`` (one of :data:`PEERS`, ``rllib`` or one of
    :data:`bench.torchrl_peer.KINDS`) on ``workload``, with a fresh copy of the workload's
    policy. ``kw`` goes to :class:`bench.rllib_peer.RLlibRunner`."""
    if kind.startswith("torchrl"):
        from bench.torchrl_peer import TorchRLRunner

        return TorchRLRunner(kind, workload, warmup_steps=warmup_steps)
    if kind.startswith("pufferlib"):
        from bench.pufferlib_peer import PufferLibRunner

        return PufferLibRunner(kind, workload.one_env_fn(), workload.num_envs, workload.make_policy(),
                               warmup_steps=warmup_steps)
    if kind.startswith("rllib"):
        from bench.rllib_peer import RLlibRunner

        return RLlibRunner(workload, warmup_steps=warmup_steps, **kw)
    return PeerRunner(kind, workload.one_env_fn(), workload.num_envs, workload.make_policy(),
                      envpool_task=workload.envpool_task, warmup_steps=warmup_steps)
