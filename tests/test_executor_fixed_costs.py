"""The executor's fixed costs per collect (issue 16: off-policy collects are often one row):
the per-env noise streams are built without ``default_rng`` but must stay its exact bits,
and a short collect does not pin the caller's thread (two affinity syscalls and a migration
per collect, for a benefit that is per row)."""
from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest

import auturi
from auturi.envs import CountingEnv
from auturi.executor.noise import BLOCK_ROWS, NoiseStreams, fill_noise, reference_noise
from auturi.executor.shm import worker


def _reference(rows: int, n: int, k: int, seed: int, first: int, step: int) -> np.ndarray:
    out = np.zeros((rows, n, k), np.float32)
    for i in range(n):
        out[:, i] = np.random.default_rng([seed, first + i, step]).random((rows, k), dtype=np.float32)
    return out


@pytest.mark.parametrize("seed,first,step", [
    (0, 0, 0), (3, 5, 12345), (2**32 - 1, 0, 2**32 - 1),  # the fast path's edges
    (2**32, 0, 7), (5, 2**32 - 2, 1), (1, 2, 2**32), (2**40 + 3, 7, 2**33 + 1),  # words >= 2**32: default_rng
])
@pytest.mark.parametrize("rows,n,k", [(1, 8, 12), (5, 3, 1), (64, 2, 7)])
def test_noise_streams_are_default_rngs_bits(seed, first, step, rows, n, k):
    got = np.full((rows, n, k), np.nan, np.float32)
    fill_noise(got, seed, first, step)
    np.testing.assert_array_equal(got, _reference(rows, n, k, seed, first, step))


def _streams(rows: int, n: int, k: int, seed: int, first: int, step: int) -> np.ndarray:
    return np.stack([reference_noise(seed, first + i, step, rows, k) for i in range(n)], axis=1)


@pytest.mark.parametrize("step,rows", [(0, 1), (5, 3), (BLOCK_ROWS - 2, 5), (BLOCK_ROWS - 1, 2 * BLOCK_ROWS + 3)])
def test_noise_streams_follow_the_definition_across_blocks(step, rows):
    """Slices of one block, collects that cross one or several block boundaries."""
    got = np.full((rows, 3, 2), np.nan, np.float32)
    NoiseStreams().fill(got, 9, 2, step)
    np.testing.assert_array_equal(got, _streams(rows, 3, 2, 9, 2, step))


def test_noise_of_a_step_does_not_depend_on_how_steps_are_split_into_collects():
    """One collect of 10 rows against 1-row collects (one NoiseStreams each: a cached block
    from another seed, offset or width must not leak)."""
    whole = np.zeros((10, 4, 3), np.float32)
    NoiseStreams().fill(whole, 1, 0, BLOCK_ROWS - 4)
    streams = NoiseStreams()
    for r in range(10):
        one = np.zeros((1, 4, 3), np.float32)
        streams.fill(one, 1, 0, BLOCK_ROWS - 4 + r)
        np.testing.assert_array_equal(one[0], whole[r])
        other = np.zeros((1, 2, 3), np.float32)
        streams.fill(other, 2, 0, BLOCK_ROWS - 4 + r)  # another seed and width in between
        assert not np.array_equal(other[0], whole[r, :2])


def test_collects_draw_each_envs_stream_from_its_global_index_and_step():
    """Through a collect: env ``offset + i``'s noise at its steps (the contract's key), for
    two collects of different lengths (the second starts at step 3)."""
    policy = auturi.RandomPolicy(gym.spaces.Discrete(3))
    with auturi.make_executor(CountingEnv, policy, num_envs=3, backend="serial", seed=11) as ex:
        ex.env_id_offset = 4  # as a Ray actor's slice of a larger collection sets it
        ex.collect(3)
        noise = ex._block["noise"]
        np.testing.assert_array_equal(noise, _streams(3, 3, noise.shape[2], 11, 4, 0))
        ex.collect(2)
        np.testing.assert_array_equal(ex._block["noise"], _streams(2, 3, noise.shape[2], 11, 4, 3))


@pytest.fixture
def affinity_calls(monkeypatch):
    calls: list = []
    real = os.sched_setaffinity

    def record(pid, cpus):
        calls.append(set(cpus))
        real(pid, cpus)

    monkeypatch.setattr(os, "sched_setaffinity", record)
    return calls


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning needs Linux and two usable cores")
def test_short_collects_leave_the_callers_thread_unpinned(affinity_calls):
    policy = auturi.RandomPolicy(gym.spaces.Discrete(3))
    config = auturi.Config(envs_per_actor=6, env_parallel_degree=3)  # the actor and two env workers
    with auturi.make_executor(CountingEnv, policy, num_envs=6, backend="shm", config=config) as ex:
        assert ex._host.pin_cpu is not None  # the plan pins this actor: the rule below is what skips it
        before = os.sched_getaffinity(0)
        affinity_calls.clear()
        ex.collect(1)
        ex.collect(worker.PIN_MIN_ROWS - 1)
        assert affinity_calls == []
        ex.collect(worker.PIN_MIN_ROWS)
        assert affinity_calls == [{ex._host.pin_cpu}, before]  # pinned for the collect, restored after
        assert os.sched_getaffinity(0) == before


def test_weights_block_rewrites_values_in_place_and_relayouts_on_new_shapes():
    """Off-policy training publishes weights every collect: the same names and shapes reuse
    the block (values rewritten, layout head kept), anything else gets a new layout."""
    from auturi.executor.buffers import WeightsBlock

    first = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.arange(4.0)[::2]}
    block = WeightsBlock.write(first, None)
    try:
        again = WeightsBlock.write({k: v * 2 for k, v in first.items()}, block)
        assert again is block
        got = WeightsBlock.read(block.name)
        assert list(got) == ["w", "b"] and all(np.array_equal(got[k], first[k] * 2) for k in first)
        block = WeightsBlock.write({"w": np.ones((3, 3), np.float64)}, again)
        got = WeightsBlock.read(block.name)
        assert list(got) == ["w"] and got["w"].dtype == np.float64 and got["w"].shape == (3, 3)
    finally:
        block.close()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning needs Linux and two usable cores")
def test_an_actor_with_one_env_worker_leaves_the_callers_thread_unpinned(affinity_calls):
    policy = auturi.RandomPolicy(gym.spaces.Discrete(3))
    config = auturi.Config(envs_per_actor=4, env_parallel_degree=2)
    with auturi.make_executor(CountingEnv, policy, num_envs=4, backend="shm", config=config) as ex:
        assert ex._host.pin_cpu is not None
        affinity_calls.clear()
        ex.collect(4 * worker.PIN_MIN_ROWS)
        assert affinity_calls == []
