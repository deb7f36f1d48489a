"""``model.auturi.close()`` (how the README's example ends) gives back a plain SB3 model
(issue 34, item 8): it ends the workers, ``learn`` then trains as SB3's own loop does, on the
model's own env, and ``auturi.wrap`` wraps it again."""
from __future__ import annotations

import pytest

pytest.importorskip("stable_baselines3")

from stable_baselines3 import PPO, SAC
from stable_baselines3.common.env_util import make_vec_env

import auturi
from auturi.errors import AuturiError

pytestmark = pytest.mark.filterwarnings("ignore:You have specified a mini-batch size")

WORKERS = auturi.Config(num_actors=1, envs_per_actor=2, env_parallel_degree=2)  # an env worker process


def monitor_steps(model) -> int:
    """Steps the model's own envs (their Monitors) have taken: plain SB3's loop steps them,
    Auturi's executor steps its own copies."""
    return sum(sum(e.get_episode_lengths()) + len(e.rewards) for e in model.env.envs)


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_close_gives_back_a_plain_model_that_trains_and_wraps_again(algo):
    if algo == "ppo":
        model = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=0), n_steps=16, batch_size=32,
                    n_epochs=1, seed=0, device="cpu")
    else:
        model = SAC("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=2, seed=0), learning_starts=8, batch_size=16,
                    train_freq=(4, "step"), gradient_steps=1, seed=0, device="cpu")
    model = auturi.wrap(model, config=WORKERS)
    handle = model.auturi
    model.learn(64)
    assert monitor_steps(model) == 0  # the executor's envs stepped, not the model's
    model.auturi.close()

    with pytest.raises(AuturiError, match="closed"):
        handle.executor.collect(1)  # the workers are gone
    assert "auturi" not in vars(model) and "collect_rollouts" not in vars(model)
    assert model._last_obs is None  # SB3's next learn resets the model's env, even with reset_num_timesteps=False
    handle.close()  # idempotent

    # plain SB3 again: its own loop steps the model's env, from a reset (the executor's last
    # observation belonged to envs that are gone)
    before = model.num_timesteps
    model.learn(32, reset_num_timesteps=False)
    assert model.num_timesteps >= before + 32
    assert monitor_steps(model) >= 32

    model = auturi.wrap(model, config=WORKERS)
    try:
        model.learn(32, reset_num_timesteps=False)
        assert model.auturi.collects > 0
    finally:
        model.auturi.close()
    assert "auturi" not in vars(model)


def test_after_a_failure_learn_says_to_close_and_close_gives_back_the_model():
    from stable_baselines3.common.monitor import Monitor

    from auturi.envs import CountingEnv, FaultyEnv

    model = PPO("MlpPolicy", make_vec_env(CountingEnv, n_envs=2, seed=0), n_steps=16, batch_size=32, n_epochs=1,
                seed=0, device="cpu")
    model = auturi.wrap(model, config=auturi.Config.serial(2), backend="serial",
                        env_fn=lambda: Monitor(FaultyEnv(fail_step=20)))
    with pytest.raises(Exception, match="fails on purpose"):
        model.learn(64)
    with pytest.raises(AuturiError, match=r"call model.auturi.close\(\) to make the model plain SB3 again"):
        model.learn(64)
    model.auturi.close()
    model.learn(64)  # plain SB3, on the model's own CountingEnvs
    assert model.num_timesteps == 64


def test_close_removes_what_wrap_sets():
    """handle.py keeps its own list of what wrap_sb3 sets (wrap.py imports handle.py, so the
    handle cannot call back into it): the two lists must not drift apart."""
    from auturi.adapters.sb3 import handle, wrap

    assert set(handle.PATCHED) == set(wrap.PATCHED)


def test_close_right_after_wrap_gives_back_the_model():
    """No ``learn`` between: the handle knows its model from ``wrap`` on."""
    model = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=0), n_steps=16, batch_size=32,
                n_epochs=1, seed=0, device="cpu")
    model = auturi.wrap(model, config=WORKERS)
    model.auturi.close()
    assert "collect_rollouts" not in vars(model) and "auturi" not in vars(model)
    model.learn(32)
    assert monitor_steps(model) >= 32
