"""The test envs behave as documented."""
from __future__ import annotations

import numpy as np

from auturi.envs import HeavyTailEnv


def _slow_steps(seed: int) -> np.ndarray:
    env = HeavyTailEnv(base_seconds=0.0, tail_prob=0.2)
    env.reset(seed=seed)
    return env._cost_rng.random(200) < env.tail_prob  # the draws its next 200 steps would make


def test_heavy_tail_envs_stall_independently_and_reproducibly():
    a, b = _slow_steps(0), _slow_steps(1)
    assert 0.1 < a.mean() < 0.3
    assert not np.array_equal(a, b)  # envs of one vector are not slow on the same steps
    assert np.array_equal(a, _slow_steps(0))  # the same seed stalls on the same steps


def test_the_emulated_sim_id_makes_its_env_and_frames_follow_the_actions():
    import gymnasium as gym

    from auturi.testing.emulated_sim import EmulatedSimEnv

    def run(actions):
        env = gym.make("auturi/EmulatedSim-v0", profile="straggler", time_scale=0.0, episode_steps=(3, 3))
        obs, _ = env.reset(seed=1)
        assert isinstance(env.unwrapped, EmulatedSimEnv) and env.unwrapped.profile.name == "straggler"
        assert env.observation_space.contains(obs) and obs.shape == (4, 84, 84)
        out = [env.step(a) for a in actions]
        return np.stack([o for o, *_ in out]), [terminated for _, _, terminated, _, _ in out]

    frames, ends = run([0, 1, 2])
    assert ends == [False, False, True]  # an episode of exactly episode_steps steps
    same, _ = run([0, 1, 2])
    other, _ = run([0, 2, 2])
    assert np.array_equal(frames, same)  # reproducible
    assert np.array_equal(frames[0], other[0]) and not np.array_equal(frames[1], other[1])  # actions show
    assert np.array_equal(frames[1, :3], frames[0, 1:])  # a stack of the last 4 frames, the newest last
