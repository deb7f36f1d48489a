"""The ``serial`` backend: every actor, env and replica in the caller's process.

With a serial config (one actor, degree 1, one policy) it is a plain loop, as cheap as
SB3's DummyVecEnv. With any other config it runs the very same actor loop the ``shm``
backend runs, lanes in-process and actors one after another: a debugging and reference
mode whose data must equal every other backend's.
"""
from __future__ import annotations

import numpy as np

from auturi.config import Config
from auturi.executor.actor_loop import ActorLoop
from auturi.executor.base import Executor
from auturi.executor.env_runner import EnvRunner, make_env_runner
from auturi.executor.layout import plan_layout
from auturi.executor.local_lanes import LocalEnvLane, LocalPolicyLane
from auturi.executor.policy_runner import PolicyRunner


def _no_remote():  # the serial backend has no remote lane to wait for
    raise AssertionError("serial backend waited for a remote lane")


class SerialExecutor(Executor):
    backend = "serial"

    def __init__(self, *args, **kwargs):
        self._envs: EnvRunner | None = None
        self._policy: PolicyRunner | None = None
        self._loops: list[ActorLoop] = []
        super().__init__(*args, **kwargs)

    def _apply_config(self, config: Config) -> None:
        if self._envs is None:
            self._envs = make_env_runner(range(self.num_envs), self.env_fns, self.seed, id_offset=self.env_id_offset)
            self._policy = PolicyRunner(self.policy)
            self.policy.to(config.policy_device)
        elif config.policy_device != (self._config.policy_device if self._config else "cpu"):
            self.policy.to(config.policy_device)
        # The torch thread count is chosen on the first batch (PolicyRunner's thread rule);
        # a new layout may hand the policy other batch sizes or another device.
        assert self._policy is not None
        self._policy.recalibrate()
        env_lane = LocalEnvLane(self._envs)
        pol_lane = LocalPolicyLane(self._policy)
        # Only the plan's shares, replicas, batch and lockstep choice matter here: no process.
        self._loops = [
            ActorLoop(ap.env_ids, [env_lane] * len(ap.env_shares), [pol_lane] * len(ap.replicas), ap.batch_size,
                      _no_remote, lockstep=ap.lockstep)
            for ap in plan_layout(config).actors
        ]

    def _on_new_block(self) -> None:
        assert self._envs is not None and self._policy is not None and self._block is not None
        self._envs.bind(self._block.arrays)
        self._policy.bind(self._block.arrays)

    def _run_actors(self, num_steps: int) -> tuple[float, float, float]:
        envs, pol = self._envs, self._policy
        assert envs is not None and pol is not None
        e0, p0 = envs.env_seconds, pol.policy_seconds
        if envs.fresh:
            envs.reset_all()
        for loop in self._loops:
            loop.run(num_steps)
        return envs.env_seconds - e0, pol.policy_seconds - p0, 0.0

    def _gather_finals(self):
        assert self._envs is not None
        return self._envs.take_finals()

    def _publish_weights(self, state: dict[str, np.ndarray], version: int) -> None:
        self.policy.load_state(state)

    def _close_workers(self) -> None:
        if self._envs is not None:
            self._envs.close()
