"""The ``serial`` backend: every actor, env and replica in the caller's process.

With a serial config (one actor, degree 1, one policy) it is a plain loop, as cheap as
SB3's DummyVecEnv. With any other config it runs the very same actor loop the ``shm``
backend runs, lanes in-process and actors one after another: a debugging and reference
mode whose data must equal every other backend's.

``worker_timeout`` holds here too, for the caller's own thread (:class:`CallerWatchdog`): an
env reset or step, or a policy batch, that makes no progress for that long is reported on
stderr with the thread's Python stack, interrupted, and the collect raises
:class:`~auturi.WorkerError` naming the env; the executor closes. The envs' first resets are
allowed ``max(worker_timeout, 60)`` seconds (a simulator's launch). What it cannot interrupt:
C code that never returns to Python (see :class:`CallerWatchdog`); such envs belong in env
workers (``Config(env_parallel_degree=...)``), where the stuck process is ended.

Env calls (``env_method``, ``get_attr``, ``set_attr``) run on the one runner here; no
reconfigure moves an env, so what they change stays.

``check_finite`` (an executor attribute, off by default): NaN or inf in an observation or a
reward is an :class:`~auturi.EnvCheckError` (see :class:`EnvRunner`).
"""
from __future__ import annotations

import weakref

import numpy as np

from auturi.config import Config
from auturi.executor.actor_loop import ActorLoop
from auturi.executor.base import Executor
from auturi.executor.env_runner import EnvRunner, make_env_runner
from auturi.executor.layout import plan_layout
from auturi.executor.local_lanes import START_TIMEOUT_FLOOR, CallerWatchdog, LocalEnvLane, LocalPolicyLane
from auturi.executor.policy_runner import PolicyRunner


def _no_remote():  # the serial backend has no remote lane to wait for
    raise AssertionError("serial backend waited for a remote lane")


class SerialExecutor(Executor):
    backend = "serial"

    def __init__(self, *args, **kwargs):
        self._envs: EnvRunner | None = None
        self._policy: PolicyRunner | None = None
        self._loops: list[ActorLoop] = []
        self._beats: list = []  # the loops' progress words, which the watchdog reads
        self._watchdog: CallerWatchdog | None = None
        super().__init__(*args, **kwargs)

    def _apply_config(self, config: Config) -> None:
        if self._envs is None:
            self._envs = make_env_runner(range(self.num_envs), self.env_fns, self.seed, id_offset=self.env_id_offset,
                                         check_finite=getattr(self, "check_finite", False))
            self._envs.check_travel = False  # no env ever moves here: no pickle round trip after env calls
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
        self._beats[:] = [loop.beat for loop in self._loops]  # in place: the watchdog holds this list
        if self._watchdog is None:
            beats, me = self._beats, weakref.ref(self)
            self._watchdog = CallerWatchdog(
                self.worker_timeout, lambda: sum(int(words[k]) for words, k in list(beats)),
                "in the caller's process, serial backend", lambda: getattr(me(), "_config", None))

    def _on_new_block(self) -> None:
        assert self._envs is not None and self._policy is not None and self._block is not None
        self._envs.bind(self._block.arrays)
        self._policy.bind(self._block.arrays)

    def _run_actors(self, num_steps: int) -> tuple[float, float, float]:
        envs, pol, watch = self._envs, self._policy, self._watchdog
        assert envs is not None and pol is not None and watch is not None
        e0, p0 = envs.env_seconds, pol.policy_seconds
        if envs.fresh:
            watch.run(envs.reset_all, timeout=max(self.worker_timeout, START_TIMEOUT_FLOOR))
        watch.run(self._run_loops, num_steps)
        return envs.env_seconds - e0, pol.policy_seconds - p0, 0.0

    def _run_loops(self, num_steps: int) -> None:
        for loop in self._loops:
            loop.run(num_steps)

    def _gather_finals(self):
        assert self._envs is not None
        return self._envs.take_finals()

    def _publish_weights(self, state: dict[str, np.ndarray], version: int) -> None:
        self.policy.load_state(state)

    def _call_envs(self, call):
        """Every env is in this process's one runner: the call runs there, in ``call.ids`` order."""
        assert self._envs is not None
        return self._envs.call(call)

    def _close_workers(self) -> None:
        if self._watchdog is not None:
            self._watchdog.close()
        if self._envs is not None:
            self._envs.close()
