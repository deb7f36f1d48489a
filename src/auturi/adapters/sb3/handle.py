"""``model.auturi``: the SB3 face's handle (:class:`SB3Handle`) over the shared
:class:`~auturi.adapters.common.FaceHandle`: it ships the weights (and VecNormalize
statistics) before each collect, tells the tuner how much of ``learn()`` is left, and logs
the collect to SB3's logger."""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from auturi.adapters.common import Collector, FaceHandle, remaining_collects


class SB3Handle(FaceHandle):
    """What :func:`~auturi.adapters.sb3.wrap_sb3` attaches to the model as ``model.auturi``:
    the executor, the optional online tuner and the last rollout's stats. ``close()`` ends
    the workers."""

    def __init__(self, collector: Collector, adapter: Any, vecnorm: Any, source_env: Any, seed: int,
                 raw_observation_space: gym.Space):
        super().__init__(collector, seed)
        self.adapter = adapter
        self.vecnorm = vecnorm
        self.source_env = source_env
        self.raw_observation_space = raw_observation_space
        self.cut_episodes = 0  # episodes a reconfigure cut short (see on_policy.restart_cut_episodes)
        self._locked_logged = False

    def state(self, model: Any) -> dict[str, np.ndarray]:
        return self.adapter.state_of(model, self.vecnorm)

    def collect(self, model: Any, num_steps: int, extra_state: dict[str, np.ndarray] | None = None) -> Any:
        """Publish the weights (plus ``extra_state``: per-collect exploration settings), collect
        ``num_steps`` per env and log it."""
        state = self.state(model)
        if extra_state:
            state.update(extra_state)
        self.executor.set_policy_state(state)
        # The replay normalises the observations with self.adapter's statistics: they must be
        # the ones the replicas act with in this rollout. The executor loads the state into
        # this object only when the layout runs the policy in this process; with replicas
        # elsewhere (two actors, policy workers) it kept the statistics of wrap time, and the
        # buffer got observations normalised otherwise than the policy had seen them.
        self.adapter.load_obs_stats(state)
        left = int(getattr(model, "_total_timesteps", 0) or 0) - int(model.num_timesteps)
        # What is left of learn(): the online tuner moves only where the move pays back within it.
        rollout = self.collect_rollout(num_steps, remaining_collects(left, num_steps * self.executor.num_envs))
        self._log(model, rollout)
        return rollout

    def _log(self, model: Any, rollout: Any) -> None:
        log = model.logger
        st = rollout.stats
        log.record("auturi/steps_per_second", float(st.steps_per_second))
        log.record("auturi/collect_seconds", float(st.seconds))
        log.record("auturi/config", str(self.executor.config), exclude=("tensorboard",))
        log.record("auturi/reconfigure_seconds", float(self.executor.last_reconfigure_seconds))
        t = self.tuner
        if t is None:
            return
        log.record("auturi/tuner_phase", t.phase, exclude=("tensorboard",))
        log.record("auturi/tuner_trials", len(t.history))
        best = t.best()
        if best is not None:
            log.record("auturi/best_steps_per_second", float(best.estimate))
        if t.locked is not None:
            res = t.result()
            log.record("auturi/choice", str(res.choice), exclude=("tensorboard",))
            for versus in ("start", "serial"):
                gain = res.speedup(versus)
                if np.isfinite(gain):
                    log.record(f"auturi/speedup_vs_{versus}", float(gain))
            if not self._locked_logged and model.verbose >= 1:
                print(f"auturi: locked in {res.choice} ({res.reason})")
            self._locked_logged = True

