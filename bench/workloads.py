"""Named benchmark workloads: an env, how many of them, a policy and a rollout length.

Importing this module does not import torch (the policies are built on demand), nor any
optional simulator: a workload whose simulator is missing raises
:class:`WorkloadUnavailable` naming the ``pip install`` that fixes it, when it is used.

=============  ==========================================  =====  =====  ===========================
name           env                                          envs   steps  policy
=============  ==========================================  =====  =====  ===========================
cartpole       gymnasium CartPole-v1                        16     128    MLP 64x64
halfcheetah    gymnasium HalfCheetah-v5 (needs mujoco)      8      256    MLP 64x64, Gaussian
pong           Atari Pong, 4x84x84 frames (EnvPool/ale-py)  8      128    Nature CNN
slow           auturi SlowEnv (~1 ms waiting per step)      16     64     MLP 64x64
heavytail      auturi HeavyTailEnv (rare 50x steps)         16     128    MLP 64x64
largeobs       auturi LargeObsEnv (~1 MB observations)      4      16     pooling + MLP 64x64
football       GRF academy_3_vs_1_with_keeper (EnvPool)    8      64     Nature CNN on 72x96x4 SMM
=============  ==========================================  =====  =====  ===========================

Example:
    >>> from bench.workloads import get_workload
    >>> w = get_workload("slow")
    >>> w.num_envs, w.num_steps
    (16, 64)
    >>> ex = w.make_executor(backend="serial")   # doctest: +SKIP
"""
from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from auturi.envs import HeavyTailEnv, LargeObsEnv, SlowEnv, resolve_env_fns


class WorkloadUnavailable(RuntimeError):
    """A workload's simulator is not installed; the message says what to install."""


# ---------------------------------------------------------------------------- env factories
def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def make_cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def make_halfcheetah() -> gym.Env:
    return gym.make("HalfCheetah-v5")


def make_pong_ale() -> gym.Env:
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1)
    env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)
    return gym.wrappers.FrameStackObservation(env, 4)


def make_slow() -> gym.Env:
    return SlowEnv(step_seconds=1e-3)


def make_heavytail() -> gym.Env:
    return HeavyTailEnv()


def make_largeobs() -> gym.Env:
    return LargeObsEnv()


# ---------------------------------------------------------------------------- policies
def mlp_policy(obs_dim: int, action_space: gym.Space) -> Any:
    """A :class:`auturi.TorchPolicy` around :class:`auturi.nets.MLPActorCritic`."""
    from auturi.nets import MLPActorCritic
    from auturi.policy import TorchPolicy

    if isinstance(action_space, gym.spaces.Discrete):
        fn = functools.partial(MLPActorCritic, obs_dim, int(action_space.n))
    else:
        fn = functools.partial(MLPActorCritic, obs_dim, int(np.prod(action_space.shape)), continuous=True)
    return TorchPolicy(fn, action_space)


def cnn_policy(in_channels: int, action_space: gym.spaces.Discrete) -> Any:
    """A :class:`auturi.TorchPolicy` around :class:`auturi.nets.NatureCNNActorCritic`."""
    from auturi.nets import NatureCNNActorCritic
    from auturi.policy import TorchPolicy

    return TorchPolicy(functools.partial(NatureCNNActorCritic, in_channels, int(action_space.n)), action_space)


def pooled_mlp(channels: int, act_dim: int, pool: int = 8) -> Any:
    """An :class:`auturi.nets.MLPActorCritic` behind an average-pooling front end, for
    large image observations (an MLP on 1 MB of raw pixels would have ~10^8 weights)."""
    import torch
    from torch import nn

    from auturi.nets import MLPActorCritic

    class PooledMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pool = nn.AdaptiveAvgPool2d((pool, pool))
            self.mlp = MLPActorCritic(channels * pool * pool, act_dim)

        def forward(self, obs: torch.Tensor):
            return self.mlp(self.pool(obs.float() / 255.0))

    # Only this factory is pickled to replicas (TorchPolicy ships the factory, not the
    # module), so a class local to it is fine.
    return PooledMLP()


def smm_cnn(height: int, width: int, channels: int, act_dim: int) -> Any:
    """:class:`auturi.nets.NatureCNNActorCritic` on channels-last frames (Google Research
    Football's stacked super-mini-map, 72x96x4): transposed to channels first, with the
    trunk's linear layer sized for the frame."""
    import torch
    from torch import nn

    from auturi.nets import NatureCNNActorCritic

    class SMMCNN(NatureCNNActorCritic):
        def __init__(self) -> None:
            super().__init__(channels, act_dim)
            with torch.no_grad():  # the conv stack's output size for this frame
                flat = self.trunk[:-2](torch.zeros(1, channels, height, width)).shape[1]
            self.trunk[-2] = nn.Linear(flat, 512)

        def forward(self, obs: torch.Tensor):
            return super().forward(obs.permute(0, 3, 1, 2))

    return SMMCNN()


def smm_cnn_policy(height: int, width: int, channels: int, action_space: gym.spaces.Discrete) -> Any:
    """A :class:`auturi.TorchPolicy` around :func:`smm_cnn`."""
    from auturi.policy import TorchPolicy

    return TorchPolicy(functools.partial(smm_cnn, height, width, channels, int(action_space.n)), action_space)


def pooled_mlp_policy(channels: int, action_space: gym.spaces.Discrete) -> Any:
    """A :class:`auturi.TorchPolicy` around :func:`pooled_mlp`."""
    from auturi.policy import TorchPolicy

    return TorchPolicy(functools.partial(pooled_mlp, channels, int(action_space.n)), action_space)


# ---------------------------------------------------------------------------- workloads
@dataclass(frozen=True)
class Workload:
    """A named benchmark setting. ``env`` and ``policy_fn`` are picklable."""

    name: str
    description: str
    env_id: str
    """The simulator's id (for reports and fingerprints)."""
    num_envs: int
    num_steps: int
    env: str | Callable[[], gym.Env] | None
    """What :func:`auturi.make_executor` takes: a picklable factory, or an id such as
    ``"envpool:Pong-v5"``; None when the simulator is not installed."""
    policy_fn: Callable[[], Any]
    requires: tuple[str, ...] = field(default=())
    """Modules that must be importable."""
    install: str = ""
    """What to run when they are not."""
    envpool_task: str | None = None
    """The same simulator's EnvPool task id, for the EnvPool peer (None: EnvPool has none)."""

    def check(self) -> None:
        """Raise :class:`WorkloadUnavailable` if the simulator is not installed."""
        missing = [m for m in self.requires if not _has(m)]
        if missing or self.env is None:
            raise WorkloadUnavailable(
                f"workload {self.name!r} needs {', '.join(missing or self.requires)}, which is not installed: "
                f"{self.install}")

    def make_env(self) -> str | Callable[[], gym.Env]:
        """The env factory or id for :func:`auturi.make_executor` (checked)."""
        self.check()
        assert self.env is not None
        return self.env

    def one_env_fn(self) -> Callable[[], gym.Env]:
        """A zero-argument factory of one gymnasium env of this workload (an EnvPool id
        becomes a one-env :class:`auturi.envs.envpool.EnvPoolEnv`), for the gymnasium, SB3
        and RLlib peers."""
        return resolve_env_fns(self.make_env(), 1)[0]

    def make_policy(self) -> Any:
        """A fresh policy (imports torch)."""
        return self.policy_fn()

    def make_executor(self, backend: str = "shm", config: Any = None, seed: int = 0, num_envs: int | None = None,
                      **kwargs: Any) -> Any:
        """An :func:`auturi.make_executor` for this workload."""
        import auturi

        return auturi.make_executor(self.make_env(), self.make_policy(), num_envs or self.num_envs, config,
                                    backend=backend, seed=seed, **kwargs)

    def fingerprint(self) -> dict[str, Any]:
        """Extra fields for the tuner's workload fingerprint."""
        return {"workload": self.name, "env_id": self.env_id}


def _pong_env() -> str | Callable[[], gym.Env] | None:
    # EnvPool's Atari has the standard preprocessing built in (84x84 gray, 4 frames) and
    # auturi steps it in C++ batches; ale-py with gymnasium's wrappers is the fallback.
    if _has("envpool"):
        return "envpool:Pong-v5"
    if _has("ale_py"):
        return make_pong_ale
    return None


_PONG_ENV = _pong_env()
# EnvPool's wheel ships Google Research Football (its engine built in, no download at run
# time): the Auturi paper's third workload. Default observation: the 72x96 super-mini-map, 4
# stacked planes, channels last; 19 actions.
FOOTBALL_TASK = "gfootball/academy_3_vs_1_with_keeper-v1"

WORKLOADS: dict[str, Workload] = {
    w.name: w for w in [
        Workload("cartpole", "CartPole-v1 with an MLP: a cheap env where IPC costs more than stepping",
                 "CartPole-v1", 16, 128, make_cartpole,
                 functools.partial(mlp_policy, 4, gym.spaces.Discrete(2)), envpool_task="CartPole-v1"),
        Workload("halfcheetah", "MuJoCo HalfCheetah-v5 with a Gaussian MLP: a moderate CPU-bound simulator",
                 "HalfCheetah-v5", 8, 256, make_halfcheetah,
                 functools.partial(mlp_policy, 17, gym.spaces.Box(-1.0, 1.0, (6,), np.float32)),
                 requires=("mujoco",), install='pip install "gymnasium[mujoco]"', envpool_task="HalfCheetah-v5"),
        Workload("pong", "Atari Pong (4x84x84 uint8 frames) with the Nature CNN: inference-heavy",
                 "Pong-v5", 8, 128, _PONG_ENV, functools.partial(cnn_policy, 4, gym.spaces.Discrete(6)),
                 requires=("envpool",) if isinstance(_PONG_ENV, str) else ("ale_py",),
                 install='pip install envpool (or pip install "gymnasium[atari]" for ale-py)', envpool_task="Pong-v5"),
        Workload("slow", "SlowEnv: ~1 ms spent waiting per step, like a remote simulator",
                 "auturi.envs.SlowEnv", 16, 64, make_slow,
                 functools.partial(mlp_policy, 4, gym.spaces.Discrete(3))),
        Workload("heavytail", "HeavyTailEnv: 50 us steps, one in 50 takes 50x (CPU-bound)",
                 "auturi.envs.HeavyTailEnv", 16, 128, make_heavytail,
                 functools.partial(mlp_policy, 4, gym.spaces.Discrete(3))),
        Workload("largeobs", "LargeObsEnv: ~1 MB uint8 observations (3x512x683)",
                 "auturi.envs.LargeObsEnv", 4, 16, make_largeobs,
                 functools.partial(pooled_mlp_policy, 3, gym.spaces.Discrete(3))),
        Workload("football", "Google Research Football academy_3_vs_1_with_keeper (72x96x4 SMM) with a Nature CNN",
                 FOOTBALL_TASK, 8, 64, "envpool:" + FOOTBALL_TASK if _has("envpool") else None,
                 functools.partial(smm_cnn_policy, 72, 96, 4, gym.spaces.Discrete(19)),
                 requires=("envpool",), install="pip install envpool (its wheel ships Google Research Football)",
                 envpool_task=FOOTBALL_TASK),
    ]
}


def available_workloads(names: Iterable[str]) -> Iterator[Workload]:
    """The named workloads whose simulators are installed; each one that is not is skipped
    with a line saying what to install."""
    for name in names:
        w = get_workload(name)
        try:
            w.check()
        except WorkloadUnavailable as e:
            print(f"{name}: skipped ({e})")
            continue
        yield w


def get_workload(name: str) -> Workload:
    """A workload by name; ``ValueError`` lists the names for an unknown one."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose one of {sorted(WORKLOADS)}") from None
