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
        self._published: tuple | None = None  # the token of the last published state (see collect)
        self._tuner_log: tuple[tuple, dict[str, Any]] = ((), {})  # (tuner key, its records)
        self._config_log: tuple[Any, str] = (None, "")  # (config, its text)
        self.exploration: Any = None  # the off-policy replay's cached exploration state (off_policy._Exploration)

    def state(self, model: Any) -> dict[str, np.ndarray]:
        return self.adapter.state_of(model, self.vecnorm)

    def collect(self, model: Any, num_steps: int, extra_state: dict[str, np.ndarray] | None = None,
                extra_key: Any = None, measure: bool = True) -> Any:
        """Publish the weights (plus ``extra_state``: per-collect exploration settings) unless
        nothing of them changed since the last publish, collect ``num_steps`` per env and log it.
        ``extra_key``: a summary of ``extra_state`` that is equal between two calls only when
        ``extra_state`` is (the caller's, cheaper than reading the arrays); ``None``: read them.
        ``measure``: False for an off-policy warm-up collect (random actions, no policy), which
        the online tuner must not time as the training's."""
        follow = getattr(self.adapter, "follow", None)
        if follow is not None:
            follow(model.policy)
        token = self._publish_token(model, extra_state, extra_key)
        if token is None or token != self._published:
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
            self._published = token
        left = int(getattr(model, "_total_timesteps", 0) or 0) - int(model.num_timesteps)
        # What is left of learn(): the online tuner moves only where the move pays back within it.
        rollout = self.collect_rollout(num_steps, remaining_collects(left, num_steps * self.executor.num_envs), measure)
        self._log(model, rollout)
        return rollout

    def _publish_token(self, model: Any, extra_state: dict[str, np.ndarray] | None, extra_key: Any = None
                       ) -> tuple | None:
        """What the published state is made of, cheaply: equal tokens mean an equal state, so
        the publish (a copy into shared memory, a version every replica reloads) can be
        skipped: TD3 moves its actor every second update, nothing moves before
        ``learning_starts``. ``None`` (always publish): VecNormalize statistics, which move
        every step, or an adapter without :meth:`weights_token`."""
        if self.vecnorm is not None or not hasattr(self.adapter, "weights_token"):
            return None
        if extra_key is not None:
            return self.adapter.weights_token(model), "key", extra_key
        extra = tuple((k, v.dtype.str, v.shape, v.tobytes())
                      for k, v in sorted((k, np.asarray(v)) for k, v in (extra_state or {}).items()))
        return self.adapter.weights_token(model), "state", extra

    def _log(self, model: Any, rollout: Any) -> None:
        log = model.logger
        st = rollout.stats
        log.record("auturi/steps_per_second", float(st.steps_per_second))
        log.record("auturi/collect_seconds", float(st.seconds))
        config = self.executor.config
        if self._config_log[0] is not config:  # str(config) each collect cost ~10 us
            self._config_log = (config, str(config))
        log.record("auturi/config", self._config_log[1], exclude=("tensorboard",))
        log.record("auturi/reconfigure_seconds", float(self.executor.last_reconfigure_seconds))
        for key, (value, exclude) in self._tuner_records(model).items():
            log.record(key, value, exclude=exclude)

    def _tuner_records(self, model: Any) -> dict[str, tuple[Any, Any]]:
        """The tuner's records, rebuilt only when its phase, trials or choice changed: its
        ``result()`` builds a whole report (~200 us, every 1-step collect of a locked run)."""
        t = self.tuner
        if t is None:
            return {}
        locked = t.locked
        # A trial's estimate is the median of its samples, which only grow (an estimate read
        # costs ~15 us: not in the key).
        key = (t.phase, id(locked), tuple((id(tr), tr.status, len(tr.samples)) for tr in t.history))
        if key == self._tuner_log[0]:
            return self._tuner_log[1]
        best = t.best()
        out: dict[str, tuple[Any, Any]] = {"auturi/tuner_phase": (t.phase, ("tensorboard",)),
                                           "auturi/tuner_trials": (len(t.history), None)}
        if best is not None:
            out["auturi/best_steps_per_second"] = (float(best.estimate), None)
        if locked is not None:
            res = t.result()
            out["auturi/choice"] = (str(res.choice), ("tensorboard",))
            for versus in ("start", "serial"):
                gain = res.speedup(versus)
                if np.isfinite(gain):
                    out[f"auturi/speedup_vs_{versus}"] = (float(gain), None)
            if not self._locked_logged and model.verbose >= 1:
                print(f"auturi: locked in {res.choice} ({res.reason})")
            self._locked_logged = True
        self._tuner_log = (key, out)
        return out
