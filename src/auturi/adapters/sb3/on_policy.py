"""On-policy replay (PPO, A2C): :func:`collect_rollouts` stands in for SB3's
``OnPolicyAlgorithm.collect_rollouts``. It runs one executor collect, then replays the rollout
step by step exactly where SB3's loop would: ``num_timesteps``, the callback's
``update_locals`` / ``on_step`` (with SB3's local names), ``_update_info_buffer``, the
bootstrap of truncated episodes (``reward += gamma * V(terminal_obs)``),
``rollout_buffer.add`` and ``compute_returns_and_advantage``; VecNormalize statistics are
updated from the raw observations step by step as SB3 would. Callbacks therefore see
``num_timesteps`` grow by ``n_envs`` at each ``on_step``, through the same values as in SB3's
loop, but all in the replay after the collect; SB3's progress bar is redrawn at the count
the replay reached (``SB3Handle.hold_progress``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from auturi.errors import AuturiError
from auturi.adapters.sb3.handle import SB3Handle

ENV_CHANGED = ("the model's env changed after auturi.wrap (model.set_env?); the executor still runs the "
               "old envs. Call model.auturi.close() (the model is plain SB3 again), then auturi.wrap(model) again")


def collect_rollouts(self: Any, env: Any, callback: Any, rollout_buffer: Any, n_rollout_steps: int) -> bool:
    """SB3's ``OnPolicyAlgorithm.collect_rollouts`` over an Auturi executor (see the module doc)."""
    import torch as th
    from gymnasium import spaces
    from stable_baselines3.common.utils import obs_as_tensor

    h: SB3Handle = self.auturi
    if env is not h.source_env:
        raise AuturiError(ENV_CHANGED)
    self.policy.set_training_mode(False)
    n_steps = 0
    rollout_buffer.reset()
    callback.on_rollout_start()

    rollout = h.collect(self, n_rollout_steps)
    T, N = rollout.num_steps, rollout.num_envs
    adapter, vn = h.adapter, h.vecnorm
    # Observations as the policy saw them (VecNormalize: the statistics of the rollout's start).
    obs_seen = adapter.normalize_obs(rollout.observations) if vn is not None else rollout.observations
    extras = rollout.extras
    is_box = isinstance(self.action_space, spaces.Box)
    actions_all = extras["raw_actions"] if is_box else rollout.actions
    values_all, log_probs_all = extras["values"], extras["log_probs"]
    rewards_all = rollout.rewards.astype(np.float32)
    dones_all = rollout.terminated | rollout.truncated
    terminal_obs = {k: (adapter.normalize_obs(np.asarray(v)[None])[0] if vn is not None else v)
                    for k, v in rollout.final_observations.items()}
    cpu = self.device.type == "cpu"

    restart_cut_episodes(self, h, rollout.episode_starts[0], rollout.observations[0])
    checks = h.nan_checks
    if checks and h.collects == 1:  # the first observations are the envs' reset ones
        check_reset(checks, rollout.observations[0], obs_seen[0])
    held = h.hold_progress(callback, rollout.stats.seconds)
    self._last_obs = obs_seen[0]
    self._last_episode_starts = rollout.episode_starts[0]
    for t in range(T):
        if cpu:
            obs_tensor = obs_as_tensor(self._last_obs, self.device)
        actions = actions_all[t]
        values = th.as_tensor(values_all[t]).reshape(-1, 1)
        log_probs = th.as_tensor(log_probs_all[t])
        clipped_actions = rollout.actions[t]
        last_row = t == T - 1
        raw_new_obs = rollout.last_observations if last_row else rollout.observations[t + 1]
        dones = dones_all[t].copy()
        rewards = rewards_all[t].copy()
        if vn is not None:
            vn.old_obs = raw_new_obs
            vn.old_reward = rewards
            if vn.training and vn.norm_obs:
                vn.obs_rms.update(raw_new_obs)
            if vn.training:
                vn._update_reward(rewards)
            rewards = vn.normalize_reward(rewards)
            vn.returns[dones] = 0
        # The last row is normalised with the statistics updated through it, as SB3's is
        # (and as the next rollout's first row will be).
        new_obs = (vn.normalize_obs(raw_new_obs) if (vn is not None and last_row) else
                   rollout.last_observations if last_row else obs_seen[t + 1])
        if checks:
            check_step(checks, clipped_actions, dones, (raw_new_obs, rewards_all[t]),
                       (new_obs, rewards) if vn is not None else None)
        infos: list[dict[str, Any]] = []
        for i in range(N):
            if dones[i]:
                info = dict(rollout.final_infos.get((t, i), {}))
                info["TimeLimit.truncated"] = bool(rollout.truncated[t, i] and not rollout.terminated[t, i])
                info["terminal_observation"] = terminal_obs[(t, i)]
            else:
                info = {"TimeLimit.truncated": False}
            infos.append(info)

        self.num_timesteps += N

        # Give access to local variables
        callback.update_locals(locals())
        if not callback.on_step():
            return False

        self._update_info_buffer(infos, dones)
        n_steps += 1

        if isinstance(self.action_space, spaces.Discrete):
            # Reshape in case of discrete action
            actions = actions.reshape(-1, 1)

        # Handle timeout by bootstrapping with value function (SB3 issue #633)
        for idx, done in enumerate(dones):
            if (
                done
                and infos[idx].get("terminal_observation") is not None
                and infos[idx].get("TimeLimit.truncated", False)
            ):
                terminal_obs_t = self.policy.obs_to_tensor(infos[idx]["terminal_observation"])[0]
                with th.no_grad():
                    terminal_value = self.policy.predict_values(terminal_obs_t)[0]
                rewards[idx] += self.gamma * terminal_value

        rollout_buffer.add(self._last_obs, actions, rewards, self._last_episode_starts, values, log_probs)
        self._last_obs = new_obs
        self._last_episode_starts = dones

    if vn is not None:
        self._last_original_obs = rollout.last_observations
    with th.no_grad():
        # Compute value for the last timestep
        values = self.policy.predict_values(obs_as_tensor(new_obs, self.device))

    rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)

    h.show_progress(held)
    callback.update_locals(locals())

    callback.on_rollout_end()

    return True


def check_reset(checks: list[tuple[Any, bool]], raw_obs: np.ndarray, seen_obs: np.ndarray) -> None:
    """``VecCheckNan.reset``'s check (see :func:`auturi.adapters.sb3.recover.nan_checks`) on
    the first observations of the envs that train."""
    for w, above in checks:
        obs = seen_obs if above else raw_obs
        w._check_val(event="reset", observations=obs)
        w._observations = obs


def check_step(checks: list[tuple[Any, bool]], actions: np.ndarray, dones: np.ndarray,
               raw: tuple[np.ndarray, np.ndarray], seen: tuple[np.ndarray, np.ndarray] | None) -> None:
    """What each ``VecCheckNan`` checks in one ``env.step``, with its own settings
    (``raise_exception``, ``warn_once``, ``check_inf``) and message: the actions given
    (``step_async``), then the observations, rewards and dones returned (``step_wait``) as they
    reach it: ``raw`` (``(observations, rewards)`` from the envs) below ``VecNormalize``,
    ``seen`` (normalised; ``None`` without VecNormalize) above it. A replica's NaN action has
    already reached the env in the collect; it is reported here, at its step, as SB3 reports it."""
    for w, above in checks:
        w._check_val(event="step_async", actions=actions)
        w._actions = actions
    for w, above in reversed(checks):
        obs, rewards = seen if above and seen is not None else raw
        w._check_val(event="step_wait", observations=obs, rewards=rewards, dones=dones)
        w._observations = obs


def restart_cut_episodes(model: Any, h: SB3Handle, starts: np.ndarray, raw_obs: np.ndarray) -> None:
    """Account for episodes the executor cut: a reconfigure that recreates envs starts each
    with a new episode (``starts`` True) although its last one had not ended (the previous
    rollout's last ``dones`` False). The learner has already bootstrapped the cut episode
    from V(its last observation) in that rollout's GAE, exactly as SB3 bootstraps any
    episode still running at a rollout's end, so its data needs nothing more. What does:
    VecNormalize, updated as ``VecNormalize.reset()`` updates it for a restarted env (the
    running discounted return restarts, which carried the old episode's return into the new
    one's reward statistics when missed; the reset observation enters the observation
    statistics), and the count of cut episodes (``auturi/cut_episodes``): they end in no
    Monitor record, so the episode statistics miss them (and lean to the shorter episodes)."""
    if True not in np.asarray(starts).tolist():  # no env restarted, nothing cut (a 1-step collect's common case;
        model.logger.record("auturi/cut_episodes", h.cut_episodes)  # a list test ~0.2 us, the masks below ~2)
        return
    cut = np.asarray(starts, dtype=bool) & ~np.asarray(model._last_episode_starts, dtype=bool)
    h.cut_episodes += int(cut.sum())
    model.logger.record("auturi/cut_episodes", h.cut_episodes)
    vn = h.vecnorm
    if vn is not None and cut.any():
        vn.returns[cut] = 0
        if vn.training and vn.norm_obs:
            vn.obs_rms.update(raw_obs[cut])
