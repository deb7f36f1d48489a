"""RLlib's EnvRunners as a benchmark peer (imports ray; only :mod:`bench.peers` loads it, and
only when an ``rllib`` peer runs), and a learning comparison of ``auturi.wrap(config)`` with
plain RLlib for DQN, SAC, APPO and IMPALA (``python -m bench.rllib_peer learn --algo dqn``,
:func:`learn`: minutes per run, so not in the test suite).

What runs is RLlib's own sampling path, new API stack, with its default settings except
where named:

- ``PPOConfig().environment(env=<the workload's env factory>)``;
- ``.env_runners(num_env_runners=R, num_envs_per_env_runner=E, rollout_fragment_length=<the
  workload's rollout length>, num_cpus_per_env_runner=1)``: gymnasium's ``SyncVectorEnv``
  inside each runner (RLlib's default ``gym_env_vectorize_mode``), inference inside the
  runner, exploration on;
- ``R = 0``: one :class:`~ray.rllib.env.single_agent_env_runner.SingleAgentEnvRunner` built in
  this process (no Ray cluster, as ``EnvRunnerGroup`` does for its local runner);
  ``R >= 1``: an ``EnvRunnerGroup`` of ``R`` remote runners (Ray actors), sampled in parallel
  with ``foreach_env_runner``; ``E = num_envs / R`` so the total number of envs is the
  workload's;
- the RLModule is :class:`WorkloadModule`: the workload's own torch network (the same
  ``nn.Module`` factory the other peers and Auturi run), its first output the action
  distribution's inputs (RLlib's default distribution for the action space: categorical,
  or diagonal Gaussian with the module's ``log_std``). Its value head runs too, as in every
  other peer, so inference costs the same everywhere.

One sample = ``runner.sample(num_timesteps=...)`` on every runner, timed from the call to the
last runner's return; its env steps are counted from the returned episodes.
"""
from __future__ import annotations

import os
import time
from typing import Any

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.torch import TorchRLModule

_STARTED_RAY = False


class WorkloadModule(TorchRLModule):
    """An RLModule around ``model_config["model_fn"]()``, a module whose ``forward(obs)``
    returns ``(dist_params, value)`` (:mod:`auturi.nets`)."""

    def setup(self) -> None:
        self.net = self.model_config["model_fn"]()

    def _forward(self, batch: dict, **kwargs: Any) -> dict:
        with torch.no_grad():
            out, _value = self.net(batch[Columns.OBS])
        log_std = getattr(self.net, "log_std", None)
        if log_std is not None:  # RLlib's diagonal Gaussian takes [mean, log_std]
            out = torch.cat([out, log_std.expand_as(out)], dim=-1)
        return {Columns.ACTION_DIST_INPUTS: out}


class EnvCreator:
    """RLlib's env creator (``fn(env_context) -> env``) around a zero-argument factory;
    picklable, so remote runners can build the envs."""

    def __init__(self, fn: Any):
        self.fn = fn

    def __call__(self, ctx: Any = None) -> Any:
        return self.fn()


def ensure_ray(num_cpus: int) -> None:
    """Start a local Ray instance (once) whose workers can import this repository's
    ``bench`` package; ``num_cpus`` is the logical CPU count (one per runner)."""
    global _STARTED_RAY
    import ray

    if ray.is_initialized():
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.environ.get("PYTHONPATH", "")
    if root not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = root + (os.pathsep + path if path else "")  # inherited by Ray's workers
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # address="local": always a fresh instance of our own, never a cluster someone else on the
    # machine started (ray.init would otherwise join the one /tmp/ray/ray_current_cluster names)
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    _STARTED_RAY = True


def shutdown() -> None:
    """Stop the Ray instance :func:`ensure_ray` started, if any."""
    global _STARTED_RAY
    if _STARTED_RAY:
        import ray

        ray.shutdown()
        _STARTED_RAY = False


class RLlibRunner:
    """RLlib sampling of ``workload`` with ``num_env_runners`` runners (see the module doc)."""

    kind = "rllib"

    def __init__(self, workload: Any, num_env_runners: int = 0, num_envs_per_env_runner: int | None = None,
                 ray_cpus: int | None = None, warmup_steps: int = 0, seed: int = 0):
        from ray.rllib.algorithms.ppo import PPOConfig
        from ray.rllib.core.rl_module.rl_module import RLModuleSpec

        self.runners = num_env_runners
        self.envs_per_runner = num_envs_per_env_runner or max(1, workload.num_envs // max(1, num_env_runners))
        self.num_envs = self.envs_per_runner * max(1, num_env_runners)
        policy = workload.make_policy()
        self.config = (
            PPOConfig()
            .environment(env=EnvCreator(workload.one_env_fn()))
            .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=self.envs_per_runner,
                         rollout_fragment_length=workload.num_steps, num_cpus_per_env_runner=1)
            .rl_module(rl_module_spec=RLModuleSpec(module_class=WorkloadModule,
                                                   model_config={"model_fn": policy.model_fn}))
            .debugging(seed=seed)
        )
        self.settings = {"num_env_runners": num_env_runners, "num_envs_per_env_runner": self.envs_per_runner,
                         "rollout_fragment_length": workload.num_steps, "num_cpus_per_env_runner": 1,
                         "gym_env_vectorize_mode": str(self.config.gym_env_vectorize_mode),
                         "module": "workload network (WorkloadModule)"}
        self.group = self.local = None
        if num_env_runners == 0:
            from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

            self.local = SingleAgentEnvRunner(config=self.config)
        else:
            from ray.rllib.env.env_runner_group import EnvRunnerGroup

            ensure_ray(max(ray_cpus or 0, num_env_runners))
            self.group = EnvRunnerGroup(config=self.config, local_env_runner=False)
        if warmup_steps:
            self.run(warmup_steps)

    def run(self, num_steps: int) -> float:
        """Sample ``num_steps`` rows of every runner's envs; return env steps per second."""
        per_runner = num_steps * self.envs_per_runner
        t0 = time.perf_counter()
        if self.local is not None:
            steps = sum(len(e) for e in self.local.sample(num_timesteps=per_runner))
        else:
            assert self.group is not None
            steps = sum(self.group.foreach_env_runner(
                lambda r: sum(len(e) for e in r.sample(num_timesteps=per_runner)), local_env_runner=False))
        return steps / (time.perf_counter() - t0)

    def close(self) -> None:
        if self.local is not None:
            self.local.stop()
        if self.group is not None:
            self.group.stop()


# ------------------------------------------------------------------ learning: wrapped vs plain
def learning_config(algo: str, seed: int) -> Any:
    """A small RLlib config that learns its task in minutes: DQN, APPO, IMPALA on CartPole-v1,
    SAC on Pendulum-v1 (hyperparameters from RLlib's tuned examples, scaled down), 4 envs in
    RLlib's default EnvRunner layout for the algorithm."""
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.impala import IMPALAConfig
    from ray.rllib.algorithms.sac import SACConfig

    if algo == "dqn":
        cfg = DQNConfig().environment("CartPole-v1").training(
            lr=5e-4, n_step=3, epsilon=[(0, 1.0), (10000, 0.02)], num_steps_sampled_before_learning_starts=1000)
    elif algo == "sac":
        cfg = SACConfig().environment("Pendulum-v1").training(
            initial_alpha=1.001, actor_lr=2e-4, critic_lr=8e-4, alpha_lr=9e-4, lr=None, n_step=(1, 3),
            train_batch_size_per_learner=256, num_steps_sampled_before_learning_starts=256)
    elif algo in ("appo", "impala"):
        cfg = (APPOConfig() if algo == "appo" else IMPALAConfig()).environment("CartPole-v1").training(
            train_batch_size_per_learner=500)
    else:
        raise ValueError(f"unknown algorithm {algo!r}: one of dqn, sac, appo, impala")
    runners = 2 if algo in ("appo", "impala") else 0
    return cfg.env_runners(num_env_runners=runners, num_envs_per_env_runner=4 // max(1, runners)).debugging(seed=seed)


def learn(algo: str, wrapped: bool, env_steps: int, seed: int = 0) -> list[tuple[int, float]]:
    """Train until ``env_steps`` env steps were sampled; (lifetime steps, episode_return_mean)
    per iteration. ``wrapped``: through ``auturi.wrap`` with its default (the online tuner)."""
    import auturi

    cfg = learning_config(algo, seed)
    if wrapped:
        auturi.wrap(cfg, tuner_options={"cache": False})
    algo_obj = cfg.build_algo()
    curve: list[tuple[int, float]] = []
    try:
        while not curve or curve[-1][0] < env_steps:
            result = algo_obj.train()
            er = result.get("env_runners", {})  # empty while remote EnvRunners have reported nothing yet
            steps = result.get("num_env_steps_sampled_lifetime", er.get("num_env_steps_sampled_lifetime", 0))
            curve.append((int(steps), float(er.get("episode_return_mean", "nan"))))
    finally:
        algo_obj.stop()
    return curve


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.rllib_peer learn --algo dqn --steps 20000 --seeds 0 1``: plain RLlib vs
    ``auturi.wrap``, the mean episode return over the last quarter of each run."""
    import argparse

    import numpy as np

    p = argparse.ArgumentParser(prog="python -m bench.rllib_peer")
    p.add_argument("mode", choices=["learn"])
    p.add_argument("--algo", default="appo", choices=["dqn", "sac", "appo", "impala"])
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = p.parse_args(argv)
    # Logical CPUs for Ray's scheduling, not cores: the plain APPO / IMPALA runs place 2 remote
    # EnvRunners and a learner actor, which wait forever on a 2-CPU instance.
    ensure_ray(4)
    try:
        for seed in args.seeds:
            for wrapped in (False, True):
                curve = learn(args.algo, wrapped, args.steps, seed)
                tail = [r for _, r in curve[len(curve) * 3 // 4:]]
                print(f"{args.algo} seed {seed} {'auturi' if wrapped else 'rllib '}: {curve[-1][0]} steps, "
                      f"{len(curve)} iterations, last-quarter episode_return_mean {np.nanmean(tail):.1f}", flush=True)
    finally:
        shutdown()


if __name__ == "__main__":
    main()
