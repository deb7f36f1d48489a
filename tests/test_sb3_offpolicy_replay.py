"""What the off-policy replay (``auturi.adapters.sb3.off_policy``) hands SB3 around the replay
buffer, step by step, against unwrapped SB3: the callback's ``dones``, ``rewards``,
``new_obs`` and ``infos`` (``TimeLimit.truncated``, terminal observations, Monitor's episode
records), the episode count and statistics, ``dump_logs`` every ``log_interval`` episodes,
VecNormalize's normalised observations and original rewards, and one action-noise reset per
ended episode. DQN acts greedily on both sides, so the runs are the same (the buffer-level
checks for other algorithms and layouts are in ``tests/test_sb3_offpolicy.py``)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from stable_baselines3 import DQN, TD3
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.noise import NormalActionNoise, VectorizedActionNoise
from stable_baselines3.common.vec_env import VecNormalize

from auturi import Config
from auturi.adapters.sb3 import unwrap_sb3, wrap_sb3
from tests.test_sb3_offpolicy import KEYS, buffer_of
from tests.test_sb3_wrap import one_thread  # noqa: F401 - a fixture

N = 4


class Steps(BaseCallback):
    """Copies of what ``on_step`` sees, per step."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple] = []

    def _on_step(self) -> bool:
        loc = self.locals
        infos = [(sorted(i), i["TimeLimit.truncated"], i.get("terminal_observation"),
                  None if "episode" not in i else (i["episode"]["r"], i["episode"]["l"])) for i in loc["infos"]]
        self.rows.append((loc["dones"].copy(), np.array(loc["rewards"]).copy(), np.array(loc["new_obs"]).copy(),
                          infos))
        return True


def dqn(vecnorm: bool, train_freq) -> DQN:
    env = make_vec_env("CartPole-v1", n_envs=N, seed=7, env_kwargs={"max_episode_steps": 9})
    if vecnorm:
        env = VecNormalize(env, gamma=0.9)
    return DQN("MlpPolicy", env, learning_starts=0, train_freq=train_freq, buffer_size=2000, batch_size=16,
               exploration_initial_eps=0.0, exploration_final_eps=0.0, target_update_interval=20,
               policy_kwargs={"net_arch": [16]}, seed=7, device="cpu")


def run(vecnorm: bool, train_freq, wrapped: bool) -> tuple:
    model = dqn(vecnorm, train_freq)
    dumps: list[int] = []
    own_dump = model.dump_logs
    model.dump_logs = lambda: (dumps.append(model._episode_num), own_dump())[1]
    if wrapped:
        wrap_sb3(model, config=Config.serial(N), tune=False)
    else:  # greedy, as the wrapped replicas act with epsilon 0 (SB3 would still toss its coin)
        model.predict = lambda obs, state=None, episode_start=None, deterministic=False: model.policy.predict(
            obs, state, episode_start, True)
    cb = Steps()
    try:
        model.learn(200, callback=cb, log_interval=2)
    finally:
        if wrapped:
            unwrap_sb3(model)
    episodes = [(e["r"], e["l"]) for e in model.ep_info_buffer]
    return buffer_of(model), cb.rows, episodes, dumps, model._episode_num, model.num_timesteps


@pytest.mark.parametrize("vecnorm,train_freq", [(False, 1), (False, (3, "step")), (True, 1)])
def test_the_replay_hands_sb3_what_its_own_loop_would(vecnorm, train_freq, one_thread):  # noqa: F811
    got, ref = run(vecnorm, train_freq, True), run(vecnorm, train_freq, False)
    bufs, rows, episodes, dumps, episode_num, steps = got
    assert steps == ref[5] and episode_num == ref[4] and episode_num >= 4, "the runs must cross episode ends"
    for key in KEYS:
        np.testing.assert_array_equal(bufs[key], ref[0][key], err_msg=key)
    assert any(r[0].any() for r in rows) and any(t for r in rows for _, t, _, _ in r[3]), \
        "the run must see terminations and timeouts (9-step episodes)"
    assert len(rows) == len(ref[1])
    for t, (mine, theirs) in enumerate(zip(rows, ref[1])):
        for a, b, what in zip(mine[:3], theirs[:3], ("dones", "rewards", "new_obs")):
            np.testing.assert_array_equal(a, b, err_msg=f"{what} at step {t}")
        for i, (x, y) in enumerate(zip(mine[3], theirs[3])):
            assert x[0] == y[0] and x[1] == y[1] and x[3] == y[3], f"infos[{i}] at step {t}: {x} != {y}"
            np.testing.assert_array_equal(x[2], y[2], err_msg=f"terminal_observation of env {i} at step {t}")
    assert episodes == ref[2]
    assert dumps == ref[3] and dumps and all(e % 2 == 0 for e in dumps)


def test_one_noise_reset_per_ended_episode(one_thread):  # noqa: F811
    """SB3 resets the action noise of each env whose episode ended (``indices=[env]``)."""
    env = make_vec_env("Pendulum-v1", n_envs=N, seed=2, env_kwargs={"max_episode_steps": 9})
    noise = VectorizedActionNoise(NormalActionNoise(np.zeros(1), 0.2 * np.ones(1)), N)
    resets: list = []
    own = noise.reset
    noise.reset = lambda indices=None: (resets.append(indices), own(indices))[1]
    model = TD3("MlpPolicy", env, learning_starts=0, train_freq=(2, "step"), buffer_size=500, batch_size=8,
                policy_kwargs={"net_arch": [8]}, seed=2, device="cpu", action_noise=noise)
    wrap_sb3(model, config=Config.serial(N), tune=False)
    try:
        model.learn(120)
    finally:
        unwrap_sb3(model)
    dones = buffer_of(model)["dones"]
    expected = [[i] for t in range(len(dones)) for i in np.flatnonzero(dones[t])]
    assert resets[0] is None  # learn()'s own reset of every env
    assert resets[1:] == expected and len(expected) == 12  # 30 steps of 4 envs, 10-step episodes


def test_the_cached_exploration_state_follows_every_setting():
    """The exploration settings are rebuilt only when one changed (``off_policy._Exploration``),
    and always then: warm-up, DQN's epsilon, a new noise, a sigma changed in place."""
    from types import SimpleNamespace

    from auturi.adapters.sb3.off_policy import _Exploration, _exploration_state

    model = SimpleNamespace(exploration_rate=0.5)
    noise = NormalActionNoise(np.zeros(2), 0.1 * np.ones(2))
    explore = _Exploration()
    first = explore(model, False, noise)
    assert explore(model, False, noise) is first  # nothing changed: the same state, the same key
    steps = [lambda: None, lambda: setattr(model, "exploration_rate", 0.25), lambda: noise._sigma.__imul__(2),
             lambda: None]
    for i, change in enumerate(steps):
        change()
        warmup = i == 3
        key, state = explore.key, explore(model, warmup, noise)
        want = _exploration_state(model, warmup, noise)
        assert state.keys() == want.keys() and all(np.array_equal(state[k], want[k]) for k in want)
        assert (explore.key == key) == (i == 0)
    with pytest.raises(NotImplementedError, match="Ornstein"):
        from stable_baselines3.common.noise import OrnsteinUhlenbeckActionNoise

        explore(model, False, OrnsteinUhlenbeckActionNoise(np.zeros(2), np.ones(2)))


@pytest.mark.parametrize("config", [Config.serial(N), Config(num_actors=2, envs_per_actor=2)], ids=str)
def test_a_noise_changed_in_place_reaches_the_replicas(config, one_thread):  # noqa: F811
    """A callback may anneal ``action_noise._sigma`` in place: the next collect acts with it,
    in the caller's replica and in replicas elsewhere. No training (``gradient_steps=0``),
    so with sigma 0 the stored actions are the actor's own."""
    import torch

    env = make_vec_env("Pendulum-v1", n_envs=N, seed=4)
    noise = NormalActionNoise(np.zeros(1), 0.5 * np.ones(1))
    model = TD3("MlpPolicy", env, learning_starts=0, train_freq=1, gradient_steps=0, buffer_size=500,
                policy_kwargs={"net_arch": [8]}, seed=4, device="cpu", action_noise=noise)
    wrap_sb3(model, config=config, tune=False)

    def actor_gap(rows: slice) -> float:
        b = model.replay_buffer
        with torch.no_grad():
            own = model.policy.actor(torch.as_tensor(b.observations[rows].reshape(-1, 3))).numpy()
        return float(np.abs(b.actions[rows].reshape(-1, 1) - own).max())

    try:
        model.learn(40)
        for part in model.action_noise.noises:  # learn() made one copy per env of the noise given
            part._sigma *= 0.0
        model.learn(40, reset_num_timesteps=False)
    finally:
        unwrap_sb3(model)
    assert actor_gap(slice(0, 10)) > 0.1  # the noise was there
    assert actor_gap(slice(10, 20)) < 1e-5
