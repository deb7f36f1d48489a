"""The one-env worker's row path (``worker._serve_rows`` with ``EnvRunner.step_one``): it
learns that an episode ended from ``step_one``'s return value instead of comparing
``finals`` before and after, and stores its env seconds through a flat word of the control
block. Both must keep what the caller reads after a collect: every final, and each worker's
env seconds in its own slot's env column."""
from __future__ import annotations

import gymnasium as gym
import numpy as np

import auturi
from auturi.executor.env_runner import EnvRunner


def _arrays(rows: int, n: int) -> dict:
    return {"obs": np.zeros((rows + 1, n, 4), np.float32), "actions": np.zeros((rows, n), np.int64),
            "rewards": np.zeros((rows, n), np.float32), "terminated": np.zeros((rows, n), bool),
            "truncated": np.zeros((rows, n), bool), "starts": np.zeros((rows + 1, n), bool)}


def test_step_one_returns_whether_the_episode_ended():
    rows = 120  # CartPole pushed one way ends every ~10 steps
    r = EnvRunner([0], [lambda: gym.make("CartPole-v1")], seed=0)
    a = _arrays(rows, 1)
    r.bind(a)
    r.reset_all()
    ended = [r.step_one(t, 0) for t in range(rows)]
    assert all(isinstance(e, bool) for e in ended)
    assert [t for t, e in enumerate(ended) if e] == sorted(t for t, _ in r.finals)
    assert sum(ended) >= 5
    np.testing.assert_array_equal(ended, a["starts"][1:, 0])


def test_one_env_workers_report_finals_and_env_seconds_per_slot():
    n, rows = 3, 100
    policy = auturi.ConstantPolicy(gym.spaces.Discrete(2))
    serial = auturi.make_executor("CartPole-v1", policy, n, config=auturi.Config.serial(n), backend="serial")
    shm = auturi.make_executor("CartPole-v1", policy, n, config=auturi.Config(envs_per_actor=n, env_parallel_degree=n),
                               backend="shm")
    with serial, shm:
        want, got = serial.collect(rows), shm.collect(rows)
        assert sorted(got.final_observations) == sorted(want.final_observations)
        assert len(got.final_observations) >= n  # the workers' envs ended episodes too
        for key, obs in want.final_observations.items():
            np.testing.assert_array_equal(got.final_observations[key], obs)
        timing = shm._ctrl["timing"]
        workers = [s for s in range(len(timing)) if shm._ctrl["pid"][s] > 0]
        assert len(workers) == n - 1  # the actor steps env 0 itself
        for s in workers:
            assert timing[s, 0] > 0.0 and timing[s, 1] == 0.0 and timing[s, 2] == 0.0, (s, timing[s])
        assert got.stats.env_seconds > 0.0
