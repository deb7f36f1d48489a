"""Large observations on the stepping path: each frame is copied once into the rollout block
(no stacked temporary), and worker processes reuse freed memory instead of page-faulting
fresh memory in for the arrays an env makes every step (issue 19, item 3)."""
from __future__ import annotations

import resource
import tracemalloc

import gymnasium as gym
import numpy as np
import pytest

from auturi import Config, ConstantPolicy, make_executor
from auturi.executor.env_runner import LARGE_OBS_BYTES, EnvRunner

FRAME = (4, 64, 128)  # 32 KiB of uint8, above LARGE_OBS_BYTES


class FrameEnv(gym.Env):
    """Returns its one preallocated frame, filled with the step count: stepping allocates
    nothing, so whatever a step allocates is the runner's. The same buffer is returned every
    step, so a frame must be copied when it is written (it changes at the next step)."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(0, 255, FRAME, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.frame = np.zeros(FRAME, np.uint8)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.frame[...] = 0
        return self.frame, {}

    def step(self, action):
        self.t += 1
        self.frame[...] = self.t
        return self.frame, 1.0, False, False, {}


def _runner(n: int, rows: int) -> EnvRunner:
    r = EnvRunner(range(n), [FrameEnv] * n, seed=0)
    r.bind({"obs": np.zeros((rows + 1, n, *FRAME), np.uint8), "starts": np.zeros((rows + 1, n), bool),
            "actions": np.zeros((rows, n), np.int64), "rewards": np.zeros((rows, n), np.float32),
            "terminated": np.zeros((rows, n), bool), "truncated": np.zeros((rows, n), bool)})
    r.reset_all()
    return r


@pytest.mark.parametrize("path", ["step_slice", "step"])
def test_large_frames_are_copied_once_into_the_block(path):
    assert np.prod(FRAME) >= LARGE_OBS_BYTES
    n, rows = 3, 4
    r = _runner(n, rows)
    step = (lambda t: r.step_slice(t, 0, n)) if path == "step_slice" else \
        (lambda t: r.step(np.full(n, t), np.arange(n)))
    step(0)  # first steps: the env checks (they copy for their own reasons)
    tracemalloc.start()
    try:
        for t in range(1, rows):
            step(t)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    frame_bytes = int(np.prod(FRAME))
    # stacking the n frames first allocated n frames at once (and copied each twice)
    assert peak < frame_bytes, f"{peak} bytes allocated while stepping {n} envs of {frame_bytes}-byte frames"
    obs = r.a["obs"]
    for t in range(rows + 1):
        assert (obs[t] == t).all(), f"row {t}"


class AllocatingEnv(gym.Env):
    """Builds each observation from ~24 MB of float64 temporaries (as LargeObsEnv does), and
    reports in it the minor page faults its process took during that step."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(0, np.inf, (1,), np.float64)
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self) -> np.ndarray:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        base = np.arange(1 << 20, dtype=np.float64)
        v = np.abs(base * 0.01 + 1.0) % 256.0
        _ = float(v[-1])
        del base, v
        return np.array([resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before], np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        return self._obs(), 0.0, False, False, {}


def test_env_workers_reuse_freed_memory():
    """An env worker's env making ~24 MB of temporaries per step took ~6,000 page faults a
    step (all of them fresh memory, zeroed by the kernel) before workers kept freed memory."""
    cfg = Config(num_actors=1, envs_per_actor=2, env_parallel_degree=2)  # env 1 steps in an env worker
    with make_executor(AllocatingEnv, ConstantPolicy(gym.spaces.Discrete(2)), 2, config=cfg, backend="shm") as ex:
        ex.collect(4)  # warm-up: the heap grows once
        faults = ex.collect(8).observations[1:, 1, 0]
    assert faults.max() < 500, f"page faults per step in the env worker: {faults.tolist()}"
