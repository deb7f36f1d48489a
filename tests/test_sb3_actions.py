"""Issue 12 part 1: under ``auturi.wrap(model)`` envs get their actions as SB3's own loop
hands them (DummyVecEnv: an ``np.int64`` scalar for Discrete, a float32 array for Box), so an
env that computes with its action (``ActionDtypeEnv``: a float32 state times the action)
steps exactly as under SB3, and the rollout buffer equals unwrapped SB3's bit for bit
(deterministic actions) under a serial and a hybrid config (env workers, one replica acting
for all envs, as SB3 does). With two actors each replica acts on a smaller batch, whose
network outputs round differently (the executor contract: within float rounding), so there
the data that shows how the env computed (its dtype flags) is compared exactly and the rest
within rounding.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

from auturi import Config
from auturi.adapters.sb3 import unwrap_sb3, wrap_sb3
from tests.test_sb3_wrap import (  # noqa: F401 - one_thread is a fixture
    BUFFER_KEYS, assert_same_buffer, force_deterministic, learn_snapshots, one_thread)

pytestmark = pytest.mark.filterwarnings("ignore:You have specified a mini-batch size")

N, STEPS = 4, 16
CONFIGS = {"serial": Config.serial(N),
           "hybrid": Config(num_actors=1, envs_per_actor=N, env_parallel_degree=2),
           "two-actors": Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2)}


def run(action: str, config: Config | None):
    """Two rollouts (an update between) of PPO on ActionDtypeEnv, acting deterministically;
    ``config`` None: unwrapped SB3."""
    env = make_vec_env("auturi/ActionDtype-v0", n_envs=N, env_kwargs={"action": action})
    model = PPO("MlpPolicy", env, n_steps=STEPS, seed=5, device="cpu", n_epochs=1, batch_size=32)
    if config is None:
        force_deterministic(model)
    else:
        wrap_sb3(model, config=config, tune=False, deterministic=True)
    try:
        return learn_snapshots(model, 2 * STEPS * N), [e["r"] for e in model.ep_info_buffer]
    finally:
        if config is not None:
            unwrap_sb3(model)


@pytest.fixture(scope="module")
def sb3_refs():
    cache: dict[str, tuple] = {}

    def get(action: str):
        if action not in cache:
            n = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                cache[action] = run(action, None)
            finally:
                torch.set_num_threads(n)
        return cache[action]

    return get


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("action", ["discrete", "box"])
def test_buffer_equals_unwrapped_sb3_on_an_action_dtype_env(action, config, sb3_refs, one_thread):
    (ref, ref_eps), (got, got_eps) = sb3_refs(action), run(action, CONFIGS[config])
    obs = np.concatenate([b["observations"] for b in ref])
    # SB3 handed numpy values (the env's flag), and the product's dtype followed them:
    # float64 for np.int64 (Discrete), float32 for a float32 array (Box)
    stepped = ~np.concatenate([b["episode_starts"] for b in ref]).astype(bool)
    assert stepped.any() and (obs[stepped][:, 3] == 1).all()
    assert (obs[stepped][:, 2] == (8 if action == "discrete" else 4)).all()
    if config == "two-actors":
        for a, b in zip(ref, got):
            np.testing.assert_array_equal(a["observations"][..., 2:], b["observations"][..., 2:])
            np.testing.assert_array_equal(a["episode_starts"], b["episode_starts"])
            for k in BUFFER_KEYS:  # Box: the mean action rounds too, and the observations with it
                np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-5, err_msg=k)
        np.testing.assert_allclose([e for e in got_eps], ref_eps, rtol=1e-5)
    else:
        assert_same_buffer(ref, got, exact_floats=True)
        assert got_eps == ref_eps
    assert len(got_eps) > 0
