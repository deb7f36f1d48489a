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
