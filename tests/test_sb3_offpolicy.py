"""auturi.wrap around Stable-Baselines3 off-policy models (``auturi.adapters.sb3.off_policy``).

The replay buffer a wrapped model fills must be what SB3's own loop fills: bit for bit for DQN
acting greedily, within float rounding for TD3's deterministic actor, under serial and a
two-actor config, across ``learning_starts`` and ``train_freq``, with training in between
(both runs draw the same replay samples from the same global numpy stream). Warm-up actions
are auturi's (per-env seeded streams, not ``action_space.sample()``): the reference replays
them through SB3's loop, which checks everything else about those steps.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from stable_baselines3 import DQN, SAC, TD3
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.noise import OrnsteinUhlenbeckActionNoise

from auturi import Config
from auturi.adapters.sb3 import unwrap_sb3, wrap_sb3
from tests.test_sb3_wrap import one_thread  # noqa: F401 - a fixture

N = 4
KEYS = ["observations", "next_observations", "actions", "rewards", "dones", "timeouts"]
CONFIGS = {"serial": Config.serial(N), "two-actors": Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2)}


def buffer_of(model) -> dict[str, np.ndarray]:
    b = model.replay_buffer
    return {k: getattr(b, k)[:b.pos].copy() for k in KEYS}


def make(algo: str, learning_starts: int, train_freq, vec_env_cls=None, vec_env_kwargs=None):
    if algo == "dqn":
        env = make_vec_env("CartPole-v1", n_envs=N, seed=3, vec_env_cls=vec_env_cls, vec_env_kwargs=vec_env_kwargs)
        return DQN("MlpPolicy", env, learning_starts=learning_starts, train_freq=train_freq, buffer_size=2000,
                   batch_size=16, exploration_initial_eps=0.0, exploration_final_eps=0.0, target_update_interval=20,
                   policy_kwargs={"net_arch": [16]}, seed=3, device="cpu")
    env = make_vec_env("Pendulum-v1", n_envs=N, seed=3, env_kwargs={"max_episode_steps": 25})
    return TD3("MlpPolicy", env, learning_starts=learning_starts, train_freq=train_freq, buffer_size=2000,
               batch_size=16, policy_kwargs={"net_arch": [16]}, seed=3, device="cpu")


def reference(algo: str, learning_starts: int, train_freq, warmup_actions: np.ndarray) -> dict[str, np.ndarray]:
    """Unwrapped SB3, greedy (DQN's predict without its coin: eps 0 would still draw it from
    numpy's global stream, which the replay sampling shares), taking ``warmup_actions`` (the
    wrapped run's stored ones) before ``learning_starts``."""
    model = make(algo, learning_starts, train_freq)
    own = model._sample_action

    def sample(ls, action_noise=None, n_envs=1):
        if model.num_timesteps < ls:
            stored = warmup_actions[model.num_timesteps // n_envs]
            if algo == "dqn":
                return stored.reshape(n_envs), stored.reshape(n_envs)
            return model.policy.unscale_action(stored), stored
        return own(ls, action_noise, n_envs)

    model._sample_action = sample
    if algo == "dqn":
        model.predict = lambda obs, state=None, episode_start=None, deterministic=False: model.policy.predict(
            obs, state, episode_start, True)
    model.learn(240)
    return buffer_of(model)


def wrapped(algo: str, learning_starts: int, train_freq, config: Config) -> dict[str, np.ndarray]:
    model = wrap_sb3(make(algo, learning_starts, train_freq), config=config, tune=False)
    try:
        model.learn(240)
    finally:
        unwrap_sb3(model)
    return buffer_of(model)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("algo,learning_starts,train_freq", [
    ("dqn", 0, 4), ("dqn", 50, (3, "step")), ("td3", 30, 1), ("td3", 0, (2, "step"))])
def test_replay_buffer_equals_unwrapped_sb3(algo, learning_starts, train_freq, config, one_thread):  # noqa: F811
    got = wrapped(algo, learning_starts, train_freq, CONFIGS[config])
    ref = reference(algo, learning_starts, train_freq, got["actions"])
    assert len(got["dones"]) == 240 // N
    assert got["dones"].any(), "the run must cross episode ends (terminal observations, resets)"
    if algo == "td3":
        assert got["timeouts"].any()  # Pendulum truncates (25 steps here): timeouts must reach the buffer
    warm = -(-learning_starts // N)
    if warm:  # auturi's warm-up actions: drawn per env and step (both CartPole actions; all Box draws differ)
        assert len(np.unique(got["actions"][:warm])) == (2 if algo == "dqn" else warm * N)
    for key in KEYS:
        if algo == "dqn" or key in ("dones", "timeouts"):
            np.testing.assert_array_equal(got[key], ref[key], err_msg=key)
        else:  # the actor runs in replicas on other batch sizes: float rounding
            np.testing.assert_allclose(got[key], ref[key], rtol=1e-4, atol=1e-4, err_msg=key)


def test_sac_with_normal_noise_is_the_same_on_every_config(one_thread):  # noqa: F811
    """SAC samples, and action noise is added, from the executor's per-env streams: the same
    buffer under serial and two actors, actions inside [-1, 1], the noise visibly there."""
    from stable_baselines3.common.noise import NormalActionNoise

    def run(config):
        env = make_vec_env("Pendulum-v1", n_envs=N, seed=1)
        model = SAC("MlpPolicy", env, learning_starts=8, train_freq=2, buffer_size=500, batch_size=8, seed=1,
                    device="cpu", policy_kwargs={"net_arch": [8]},
                    action_noise=NormalActionNoise(np.zeros(1), 0.3 * np.ones(1)))
        wrap_sb3(model, config=config, tune=False)
        try:
            model.learn(64)
        finally:
            unwrap_sb3(model)
        return buffer_of(model)

    a, b = run(CONFIGS["serial"]), run(CONFIGS["two-actors"])
    for key in KEYS:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-4, err_msg=key)
    assert np.abs(a["actions"]).max() <= 1.0 and len(np.unique(a["actions"])) > 8


def test_errors_for_her_gsde_and_stateful_noise():
    from stable_baselines3 import HerReplayBuffer

    with pytest.raises(NotImplementedError, match="gSDE"):
        wrap_sb3(SAC("MlpPolicy", "Pendulum-v1", use_sde=True, buffer_size=100, device="cpu"))
    with pytest.raises(NotImplementedError, match="Ornstein"):
        wrap_sb3(TD3("MlpPolicy", "Pendulum-v1", buffer_size=100, device="cpu",
                     action_noise=OrnsteinUhlenbeckActionNoise(np.zeros(1), np.ones(1))))
    from stable_baselines3.common.envs import BitFlippingEnv

    her = DQN("MultiInputPolicy", BitFlippingEnv(n_bits=4, max_steps=4), buffer_size=100, device="cpu",
              replay_buffer_class=HerReplayBuffer, replay_buffer_kwargs={"n_sampled_goal": 2})
    with pytest.raises(NotImplementedError, match="HerReplayBuffer"):
        wrap_sb3(her)


def test_a_replica_takes_every_published_state_also_on_the_fast_path():
    """Loading the same names again copies the values in place (no load_state_dict per
    collect): each load must still land, and a changed shape or a move must not use stale tensors.
    A replica is an unpickled copy (the caller's own adapter acts with the model's policy)."""
    import pickle

    import torch

    model = SAC("MlpPolicy", "Pendulum-v1", device="cpu", policy_kwargs={"net_arch": [8]})
    wrap_sb3(model, config=Config.serial(1), backend="serial", tune=False)
    try:
        adapter = pickle.loads(pickle.dumps(model.auturi.executor.policy))
        adapter.load_state(model.auturi.state(model))
        for scale in (1.0, 2.0, -3.0):
            state = {k: (np.asarray(v) * scale).astype(np.asarray(v).dtype) for k, v in adapter.get_state().items()}
            adapter.load_state(state)
            got = adapter.get_state()
            assert got.keys() == state.keys()
            for k in state:
                np.testing.assert_array_equal(got[k], state[k])
        adapter.to("cpu")  # a move drops the cached tensors
        assert adapter._slots is None
        adapter.load_state(state)
        assert all(isinstance(t, torch.Tensor) for t in adapter._slots.values())
    finally:
        unwrap_sb3(model)


@pytest.mark.parametrize("learning_starts", [0, 40])
def test_the_online_tuner_does_not_time_warm_up_collects(learning_starts):
    """Before ``learning_starts`` the envs act at random and no policy runs: those collects
    are the learner's, but the tuner measures only the training's (from the first policy one)."""
    model = make("dqn", learning_starts, 4)
    wrap_sb3(model, budget_trials=2, tuner_options={"cache": False, "min_sample_seconds": 0})
    tuner = model.auturi.tuner
    seen = _learn_watching(model, 160, lambda: model.num_timesteps)  # (measured, timesteps before)
    warm = [t for m, t in seen if not m]
    assert all(t < learning_starts for t in warm) and all(t >= learning_starts for m, t in seen if m)
    assert len(warm) == -(-learning_starts // (4 * N)) == tuner.unmeasured_collects
    fed = sum(t.n + len(t.warmup) for t in tuner.history) + (tuner.current.n if tuner.current else 0)
    assert fed <= len(seen) - len(warm)  # no trial got a warm-up collect
    assert tuner.history  # the search ran on the measured ones
    # The run is keyed (cache) by the usual collect size, not by the split one at learning_starts.
    assert tuner.workload["num_steps"] == 4


def test_a_cached_choice_runs_the_warm_up_collects_too(tmp_path):
    """The off-policy face starts the tuner at the first collect, warm-up or not: a cached
    layout collects the random warm-up too (it did before warm-up collects went untimed)."""
    two = CONFIGS["two-actors"]
    opts = {"cache": str(tmp_path), "min_sample_seconds": 0, "space": _space_of(two)}
    first = wrap_sb3(make("dqn", 0, 4), tuner_options=opts)
    try:  # a record for this workload, with two actors as its choice (whatever this box measures)
        tuner = first.auturi.tuner
        while tuner.t0 is None or not tuner.history:
            tuner.collect(4)
        record = tuner.result().to_record()
        record["choice"]["config"] = two.to_dict()
        tuner.cache.store(record)
    finally:
        unwrap_sb3(first)
    model = wrap_sb3(make("dqn", 40, 4), tuner_options=opts)
    tuner = model.auturi.tuner
    configs = _learn_watching(model, 80, lambda: tuner.executor.config)  # (measured, layout)
    warm = [c for m, c in configs if not m]
    assert tuner.cached is not None and len(warm) == 3 and set(warm) == {two}


def _learn_watching(model, steps: int, what) -> list[tuple[bool, object]]:
    """``model.learn(steps)`` (then unwrap), recording for each collect the tuner made whether
    it was measured and ``what()`` just before it."""
    tuner = model.auturi.tuner
    seen: list[tuple[bool, object]] = []
    inner = tuner.collect

    def spy(num_steps, remaining_collects=None, measure=True):
        seen.append((measure, what()))
        return inner(num_steps, remaining_collects=remaining_collects, measure=measure)

    tuner.collect = spy
    try:
        model.learn(steps)
    finally:
        unwrap_sb3(model)
    return seen


def _space_of(*configs):
    from auturi.tuner import SearchSpace

    return SearchSpace(totals=(N,), cores=2, devices=("cpu",), configs=[Config.serial(N), *configs])


def test_a_subproc_vec_env_models_search_starts_on_env_workers_and_fills_the_same_buffer(one_thread):  # noqa: F811
    """Built on a SubprocVecEnv, the model's search starts from what that VecEnv runs (an env
    worker per env, the actor stepping one), set up at wrap, warm-up included; the replay
    buffer is the one the same model built on a DummyVecEnv fills on the serial layout."""
    from stable_baselines3.common.vec_env import SubprocVecEnv

    workers = Config(num_actors=1, envs_per_actor=N, env_parallel_degree=N)
    # fork: the start method is not what this test is about, and the cheapest (SB3's default,
    # forkserver, took ~6 s here to start 4 workers, against ~0.1 s for the learn itself)
    model = make("dqn", 40, 4, vec_env_cls=SubprocVecEnv, vec_env_kwargs={"start_method": "fork"})
    try:
        wrap_sb3(model, tuner_options={"cache": False, "min_sample_seconds": 0})
        tuner, executor = model.auturi.tuner, model.auturi.executor
        start = executor.config
        seen = _learn_watching(model, 400, lambda: executor.config)  # unwraps at the end
        got = buffer_of(model)
    finally:
        if hasattr(model, "auturi"):
            unwrap_sb3(model)
        model.env.close()
    assert start == workers == tuner.start_config
    assert seen[0] == (False, workers)  # the first warm-up collect ran there
    assert tuner.history[0].config == workers  # the search's start: measured first
    plain = make("dqn", 40, 4)
    wrap_sb3(plain, tune=False)
    try:
        plain.learn(400)
        assert plain.auturi.executor.config == Config.serial(N)
        want = buffer_of(plain)
    finally:
        unwrap_sb3(plain)
    assert len(got["rewards"]) == 400 // N
    for k in KEYS:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
