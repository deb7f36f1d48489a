"""Off-policy replay (SAC, TD3, DDPG, DQN, and sb3-contrib algorithms that keep SB3's
``collect_rollouts``): :func:`collect_rollouts` stands in for SB3's
``OffPolicyAlgorithm.collect_rollouts`` and fills the replay buffer as SB3's loop would.

Exploration happens in the replicas, so every random number comes from the executor's per-env
seeded noise (``docs/architecture.md``), as the on-policy sampling does; no batching or layout
changes which numbers an env sees, so every config fills the same buffer:

- before ``learning_starts`` (SB3: ``num_timesteps < learning_starts``), a uniform random
  action per env (Box: ``low + u * (high - low)``; Discrete: ``floor(u * n)``); a collect
  that crosses ``learning_starts`` is split there into two executor collects; the online
  tuner does not time these warm-up collects (no policy runs in them);
- SAC's stochastic actor samples ``tanh(mean + std * ndtri(u))``; TD3/DDPG act
  deterministically; DQN is epsilon-greedy with one coin per env (SB3 tosses one coin for
  all envs of a step) at the epsilon of the collect's start (SB3 moves it every step);
- ``NormalActionNoise`` (or ``VectorizedActionNoise`` of equal ones): ``mean + sigma *
  ndtri(u)`` per env, added to the scaled action and clipped to [-1, 1] as ``_sample_action``
  does; the buffer gets the scaled action, the env its unscaled copy.

The replay then runs SB3's own ``_update_info_buffer``, ``_store_transition`` (terminal
observations, timeouts, VecNormalize's original observations and rewards,
``optimize_memory_usage``), ``_on_step`` (DQN's target updates and epsilon schedule), the
callback and ``dump_logs`` every ``log_interval`` episodes, step by step.
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from auturi.adapters.sb3.handle import SB3Handle
from auturi.adapters.sb3.on_policy import ENV_CHANGED, check_reset, check_step, restart_cut_episodes
from auturi.adapters.sb3.policy import STATE_PREFIX, ReplicaNet
from auturi.device_wait import to_host
from auturi.errors import AuturiError

_ACTING_PARTS = ("actor", "q_net", "quantile_net")  # SAC/TD3/DDPG/TQC, DQN, QR-DQN: what predict() runs


def check_model(model: Any) -> None:
    """Refuse, with the reason and the fix, what the off-policy replay cannot reproduce."""
    from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

    name = type(model).__name__
    if type(model).collect_rollouts is not OffPolicyAlgorithm.collect_rollouts:
        raise NotImplementedError(f"{name} overrides collect_rollouts; auturi.wrap supports off-policy algorithms "
                                  f"that use SB3's own loop (SAC, TD3, DDPG, DQN, TQC, QR-DQN)")
    if type(model.replay_buffer).__name__ == "HerReplayBuffer":
        raise NotImplementedError("HerReplayBuffer is not supported by auturi.wrap: it relabels goals from whole "
                                  "episodes in Dict observations. Train HER models without auturi.wrap")
    if model.use_sde:
        raise NotImplementedError("gSDE (use_sde=True) is not supported by auturi.wrap yet: its exploration noise is "
                                  "a per-env matrix resampled every sde_sample_freq steps. Train with use_sde=False")
    if not any(hasattr(model.policy, part) for part in _ACTING_PARTS):
        raise NotImplementedError(f"auturi.wrap needs a policy with one of {_ACTING_PARTS}; "
                                  f"{type(model.policy).__name__} has none")
    space = model.action_space
    if not isinstance(space, (gym.spaces.Box, gym.spaces.Discrete)):
        raise NotImplementedError(f"auturi.wrap supports Box and Discrete action spaces off-policy, not {space}")
    if isinstance(space, gym.spaces.Box) and not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        raise NotImplementedError("auturi.wrap needs a bounded Box action space off-policy (SB3 scales actions to "
                                  "[-1, 1] by its bounds)")
    normal_noise(model.action_noise)


def normal_noise(noise: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """``(mean, sigma)`` of the action noise, the same for every env, or ``None``; anything
    else is refused with the fix."""
    from stable_baselines3.common.noise import NormalActionNoise, VectorizedActionNoise

    if noise is None:
        return None
    parts = noise.noises if isinstance(noise, VectorizedActionNoise) else [noise]
    if not all(type(p) is NormalActionNoise for p in parts):
        kinds = sorted({type(p).__name__ for p in parts})
        raise NotImplementedError(
            f"auturi.wrap supports NormalActionNoise (and VectorizedActionNoise of equal ones), not {kinds}: a "
            f"stateful noise such as Ornstein-Uhlenbeck needs each env's history, which replicas acting for any "
            f"env in any order do not hold. Use NormalActionNoise, or train without auturi.wrap")
    mean, sigma = np.asarray(parts[0]._mu), np.asarray(parts[0]._sigma)
    if any(not (np.array_equal(p._mu, mean) and np.array_equal(p._sigma, sigma)) for p in parts[1:]):
        raise NotImplementedError("auturi.wrap needs the same NormalActionNoise for every env (replicas do not know "
                                  "which env they act for)")
    return mean, sigma


def make_adapter(model: Any, vecnorm: Any) -> OffPolicyAdapter:
    normalize = None
    if vecnorm is not None and vecnorm.norm_obs:
        normalize = {"epsilon": float(vecnorm.epsilon), "clip_obs": float(vecnorm.clip_obs)}
    part = next(p for p in _ACTING_PARTS if hasattr(model.policy, p))
    return OffPolicyAdapter(model.policy_class, model.observation_space, model.action_space,
                            dict(model.policy_kwargs), learning_rate=float(model.lr_schedule(1)),
                            normalize=normalize, state_prefix=part + ".")


class OffPolicyAdapter(ReplicaNet):
    """An auturi :class:`~auturi.policy.Policy` that runs the acting part of an SB3
    off-policy policy with the algorithm's exploration drawn from the executor's noise (see
    the module doc). Per-collect settings travel in the published state: ``auturi.warmup``
    (1: random actions), ``auturi.epsilon`` (DQN), ``auturi.noise_mean`` /
    ``auturi.noise_sigma`` (action noise). Box actions: the env gets the unscaled action, the
    extra ``buffer_actions`` holds the scaled one SB3 stores.

    Noise columns: Box ``d`` for the policy's sample (or the random action) then ``d`` for
    the action noise; Discrete: the epsilon coin, then the random action."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        space = self.action_space
        self.dim = int(np.prod(space.shape)) if isinstance(space, gym.spaces.Box) else 1
        self.noise_dim = 2 * self.dim
        self.settings = {"warmup": 0.0, "epsilon": 0.0, "noise_mean": None, "noise_sigma": None}

    def load_state(self, state: Any) -> None:
        super().load_state(state)
        for key in self.settings:
            if STATE_PREFIX + key in state:
                # A copy: the state's arrays may be views of the shared block, rewritten at the
                # next publish (the class loads with load_state_copies).
                value = np.array(state[STATE_PREFIX + key])
                self.settings[key] = float(value.reshape(-1)[0]) if key in ("warmup", "epsilon") else value

    def act(self, obs: np.ndarray, noise: np.ndarray):
        if isinstance(self.action_space, gym.spaces.Discrete):
            return self._act_discrete(obs, noise), {}
        scaled = self._scaled_box_action(obs, noise[:, :self.dim])
        mean, sigma = self.settings["noise_mean"], self.settings["noise_sigma"]
        if mean is not None and mean.size:
            import torch

            from auturi.sampling import normal_from_uniform

            u = torch.as_tensor(np.ascontiguousarray(noise[:, self.dim:]))
            loc = torch.as_tensor(np.broadcast_to(mean, scaled.shape).astype(np.float32))
            scale = torch.as_tensor(np.broadcast_to(sigma, scaled.shape).astype(np.float32))
            scaled = np.clip(scaled + normal_from_uniform(loc, scale, u).numpy(), -1, 1)
        low, high = self._low, self._high
        return (low + (0.5 * (scaled + 1.0) * (high - low))).astype(self.action_space.dtype), {
            "buffer_actions": scaled.astype(np.float32)}

    def _scaled_box_action(self, obs: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The action in [-1, 1] before action noise, as ``_sample_action`` computes it."""
        low, high = self._low, self._high
        if self.settings["warmup"]:
            unscaled = (low + u.reshape(len(obs), *low.shape) * (high - low)).astype(self.action_space.dtype)
        else:
            unscaled = self._predict_box(obs, u)
        return 2.0 * ((unscaled - low) / (high - low)) - 1.0

    def _predict_box(self, obs: np.ndarray, u: np.ndarray) -> np.ndarray:
        """``policy.predict(obs, deterministic=False)`` with SAC's sample taken from ``u``."""
        import torch

        from auturi.sampling import normal_from_uniform

        net = self.net
        with torch.no_grad():
            obs_t = net.obs_to_tensor(self.normalize_obs(obs))[0]
            actor = getattr(net, "actor", None)
            if actor is not None and hasattr(actor, "action_dist"):  # SAC, TQC: squashed Gaussian
                mean, log_std, _ = actor.get_action_dist_params(obs_t)
                a = torch.tanh(normal_from_uniform(mean, log_std.exp(), torch.as_tensor(np.ascontiguousarray(u))))
            else:
                a = net._predict(obs_t, deterministic=True)
            a = to_host(a)[0].reshape((-1, *self.action_space.shape))
        if net.squash_output:
            return net.unscale_action(a)
        return np.clip(a, self._low, self._high)

    def _act_discrete(self, obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        import torch

        space = self.action_space
        rand = space.start + np.minimum((noise[:, 1] * space.n).astype(np.int64), space.n - 1)
        if self.settings["warmup"]:
            return rand
        with torch.no_grad():
            greedy = self.net._predict(self.net.obs_to_tensor(self.normalize_obs(obs))[0], deterministic=True)
        greedy = to_host(greedy)[0].reshape(-1).astype(np.int64)
        return np.where(noise[:, 0] < self.settings["epsilon"], rand, greedy)


def _exploration_state(model: Any, warmup: bool, action_noise: Any) -> dict[str, np.ndarray]:
    """This collect's exploration settings for the replicas."""
    state = {STATE_PREFIX + "warmup": np.array([float(warmup)]),
             STATE_PREFIX + "epsilon": np.array([float(getattr(model, "exploration_rate", 0.0))])}
    params = normal_noise(action_noise)
    if params is not None:  # copies: what this collect acts with, whatever the noise object does later
        state[STATE_PREFIX + "noise_mean"], state[STATE_PREFIX + "noise_sigma"] = (np.array(p) for p in params)
    return state


class _Exploration:
    """:func:`_exploration_state`, rebuilt only when its inputs changed: a 1-step collect
    otherwise rebuilt the dict, its arrays and the noise check every step (~6 us). The key
    holds everything the state and the check depend on: the noise parts' types and their
    arrays' values (a callback may change ``_sigma`` in place). ``key`` stands for the
    state in the handle's publish token (``SB3Handle.collect``'s ``extra_key``)."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.state: dict[str, np.ndarray] = {}

    def __call__(self, model: Any, warmup: bool, action_noise: Any) -> dict[str, np.ndarray]:
        key = (bool(warmup), float(getattr(model, "exploration_rate", 0.0)), _noise_key(action_noise))
        if key != self.key:
            self.state = _exploration_state(model, warmup, action_noise)
            self.key = key
        return self.state


def _noise_key(noise: Any) -> tuple:
    """What :func:`normal_noise` reads of ``noise``, cheaply comparable."""
    if noise is None:
        return ()
    parts = getattr(noise, "noises", None) or [noise]
    return tuple((type(p), _bytes_of(getattr(p, "_mu", None)), _bytes_of(getattr(p, "_sigma", None)))
                 for p in parts)


def _bytes_of(a: Any) -> tuple:
    a = np.asarray(a)
    return a.dtype.str, a.shape, a.tobytes()


def collect_rollouts(self: Any, env: Any, callback: Any, train_freq: Any, replay_buffer: Any,
                     action_noise: Any = None, learning_starts: int = 0, log_interval: int | None = None) -> Any:
    """SB3's ``OffPolicyAlgorithm.collect_rollouts`` over an Auturi executor (see the module doc)."""
    from stable_baselines3.common.type_aliases import RolloutReturn, TrainFrequencyUnit

    h: SB3Handle = self.auturi
    if env is not h.source_env:
        raise AuturiError(ENV_CHANGED)
    self.policy.set_training_mode(False)
    n = env.num_envs
    in_steps = train_freq.unit == TrainFrequencyUnit.STEP
    if n > 1 and not in_steps:
        raise ValueError("train_freq in episodes needs one env (as SB3's own loop): use train_freq=(k, 'step')")
    explore = h.exploration
    if explore is None:
        explore = h.exploration = _Exploration()
    tuner = h.tuner
    if tuner is not None and tuner.t0 is None:
        # The run starts with the usual collect size (the first collect may be a split one):
        # a cached choice's layout is set up now, for the warm-up collects too.
        tuner.begin(train_freq.frequency if in_steps else 1)
    progress = {"steps": 0, "episodes": 0}
    callback.on_rollout_start()
    # SB3's should_collect_more_steps, inline (it runs once per step).
    while (progress["steps"] if in_steps else progress["episodes"]) < train_freq.frequency:
        # Steps: the rest of train_freq in one collect; episodes: one step at a time (the end is unknown).
        rows = train_freq.frequency - progress["steps"] if in_steps else 1
        warm_rows = min(rows, max(0, -(-(learning_starts - self.num_timesteps) // n)))
        if 0 < warm_rows < rows:
            rows = warm_rows  # split at learning_starts: the random part, then the policy's
        state = explore(self, warm_rows > 0, action_noise)
        # A warm-up collect runs no policy: the tuner does not time it as the training's.
        rollout = h.collect(self, rows, state, extra_key=explore.key, measure=warm_rows == 0)
        held = h.hold_progress(callback, rollout.stats.seconds)  # SB3's progress bar: drawn after the replay
        if not _replay(self, h, rollout, callback, replay_buffer, action_noise, log_interval, progress,
                       (env, train_freq, learning_starts)):
            return RolloutReturn(progress["steps"] * n, progress["episodes"], continue_training=False)
        h.show_progress(held)
    callback.on_rollout_end()
    return RolloutReturn(progress["steps"] * n, progress["episodes"], continue_training=True)


def _replay(self: Any, h: SB3Handle, rollout: Any, callback: Any, replay_buffer: Any, action_noise: Any,
            log_interval: int | None, progress: dict[str, int], loop_args: tuple = (None, None, 0)) -> bool:
    """Replay one rollout into the replay buffer step by step, with SB3's local names for the
    callback (``loop_args``: ``collect_rollouts``'s ``env``, ``train_freq``,
    ``learning_starts``, which SB3's callbacks see among its locals); ``False`` when the
    callback stops training."""
    env, train_freq, learning_starts = loop_args
    continue_training = True
    vn = h.vecnorm
    n = rollout.num_envs
    is_box = isinstance(self.action_space, gym.spaces.Box)
    first_obs = rollout.observations[0]
    restart_cut_episodes(self, h, rollout.episode_starts[0], first_obs)
    self._last_original_obs = first_obs
    self._last_obs = h.adapter.normalize_obs(first_obs) if vn is not None else first_obs
    checks = h.nan_checks
    if checks and h.collects == 1:  # the first observations are the envs' reset ones
        check_reset(checks, first_obs, self._last_obs)
    all_actions = rollout.actions
    all_buffer_actions = rollout.extras["buffer_actions"] if is_box else all_actions
    for t in range(rollout.num_steps):
        actions = all_actions[t]
        buffer_actions = all_buffer_actions[t]
        new_obs, rewards, dones, infos, ended = _step_result(rollout, t, vn)
        if checks:
            raw = (rollout.last_observations if t == rollout.num_steps - 1 else rollout.observations[t + 1],
                   rollout.rewards[t].astype(np.float32))
            check_step(checks, actions, dones, raw, (new_obs, rewards) if vn is not None else None)
        self.num_timesteps += n
        progress["steps"] += 1
        # SB3's loop counters, under its names (a callback may read them from self.locals).
        num_collected_steps, num_collected_episodes = progress["steps"], progress["episodes"]
        callback.update_locals(locals())
        if not callback.on_step():
            return False
        self._update_info_buffer(infos, dones)
        self._store_transition(replay_buffer, buffer_actions, new_obs, rewards, dones, infos)
        self._update_current_progress_remaining(self.num_timesteps, self._total_timesteps)
        self._on_step()
        self._last_episode_starts = dones
        for idx in ended:  # SB3 walks every env; only the done ones do anything
            progress["episodes"] += 1
            self._episode_num += 1
            if action_noise is not None:
                action_noise.reset(**(dict(indices=[idx]) if n > 1 else {}))
            if log_interval is not None and self._episode_num % log_interval == 0:
                self.dump_logs()
    return True


def _step_result(rollout: Any, t: int, vn: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict], list[int]]:
    """What ``env.step`` returned at row ``t`` (DummyVecEnv's auto-reset, ``VecNormalize``'s
    normalisation and statistics update, as SB3's VecEnv stack does), and the envs whose
    episode ended there."""
    raw_obs = rollout.last_observations if t == rollout.num_steps - 1 else rollout.observations[t + 1]
    rewards = rollout.rewards[t].astype(np.float32)
    truncated = rollout.truncated[t]
    dones = rollout.terminated[t] | truncated
    # A fresh dict per env (a callback may keep or change one); only a done env's says more.
    ended = [i for i, done in enumerate(dones.tolist()) if done]
    infos: list[dict[str, Any]] = [{"TimeLimit.truncated": False} for _ in range(len(dones))]
    for i in ended:
        info = dict(rollout.final_infos.get((t, i), {}))
        info["TimeLimit.truncated"] = bool(truncated[i] and not rollout.terminated[t, i])
        info["terminal_observation"] = rollout.final_observations[(t, i)]
        infos[i] = info
    if vn is None:
        return raw_obs, rewards, dones, infos, ended
    vn.old_obs, vn.old_reward = raw_obs, rewards
    if vn.training and vn.norm_obs:
        vn.obs_rms.update(raw_obs)
    new_obs = vn.normalize_obs(raw_obs)
    for i in ended:
        infos[i]["terminal_observation"] = vn.normalize_obs(infos[i]["terminal_observation"])
    if vn.training:
        vn._update_reward(rewards)
    out_rewards = vn.normalize_reward(rewards)
    vn.returns[dones] = 0
    return new_obs, out_rewards, dones, infos, ended
