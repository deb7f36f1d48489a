"""The overlapped loop's simulation (auturi.tuner.loop_sim), which the model's overlapped rows
come from: cases whose row can be worked out by hand, and the properties the model relies on."""
from __future__ import annotations

import numpy as np
import pytest

from auturi.tuner.loop_sim import overlapped_row

MS = 1e-3


def _row(E, D, P, B, steps, L, ipc=0.0, post=0.0, threaded=True):
    return overlapped_row(E, D, P, B, steps, latency=L, ipc=ipc, post=post, lane_cpu=0.5 * ipc, own_threaded=threaded)


def test_one_env_a_lane_cycles_through_its_step_and_its_pass():
    """16 lanes of one env, two replicas of batch 8: each env steps, then its batch's pass;
    with the replicas free when a batch fills, a row is one step and one pass."""
    assert _row(16, 16, 2, 8, np.full((16, 8), MS), L=MS) == pytest.approx(2 * MS)
    # four half round trips (lane -> actor -> replica -> actor -> lane) and the env worker's
    # half round trip of CPU per post
    assert _row(16, 16, 2, 8, np.full((16, 8), MS), L=MS, ipc=0.1 * MS) == pytest.approx(2.25 * MS)


def test_with_the_policy_in_the_actor_its_passes_bound_the_row():
    """One replica runs in the actor: its two passes a row (1 ms each) keep it busy all the
    row, though each env steps in 1 ms. The second batch starts a pass late: 8 rows end at
    17 ms."""
    assert _row(16, 16, 1, 8, np.full((16, 8), MS), L=MS) == pytest.approx(17 * MS / 8)


def test_a_lane_steps_one_half_while_the_other_is_on_the_device():
    """8 lanes of 8 envs, two batches of 32, each taking 4 envs of every lane (as the
    executor's spread_batch does): a lane steps one half (4 ms) while the other half's 8 ms
    pass runs; an env's cycle is its half's steps and its pass, 12 ms, not 8 + 8."""
    row = _row(64, 8, 2, 32, np.full((64, 8), MS), L=8 * MS)
    assert row == pytest.approx(12 * MS, rel=0.05)


def test_a_straggling_step_delays_its_env_not_every_batch():
    """Env i's step i takes 10 ms (one straggle each, at different steps). Lockstep would
    wait for one every row (8 rows of 11 ms + the pass); here each env's chain absorbs only
    its own."""
    E, S = 16, 8
    steps = np.full((E, S), MS)
    for i in range(S):
        steps[i, i] = 10 * MS
    lockstep = S * (10 * MS + MS)
    row = _row(E, E, 2, 8, steps, L=MS)
    assert row * S < 0.6 * lockstep
    assert row > 2 * MS  # still slower than no straggler at all


def test_the_actors_own_share_in_its_loop_holds_back_dispatching_on_a_thread_it_does_not():
    """2 lanes (the actor's own share and one env worker) of 8 envs, two replicas: stepped in
    the loop, the own share's 8 ms a row is the actor's, and the batches wait for it."""
    steps = np.full((16, 8), MS)
    in_loop = _row(16, 2, 2, 8, steps, L=2 * MS, threaded=False)
    threaded = _row(16, 2, 2, 8, steps, L=2 * MS, threaded=True)
    assert in_loop >= 8 * MS and threaded >= 8 * MS  # a lane's 8 steps a row either way
    assert in_loop > threaded


def test_the_actors_hand_offs_bound_the_row_when_they_are_the_slowest_part():
    """A post of 1 ms per hand-off: 15 posts to env workers and 2 batches a row."""
    row = _row(16, 16, 2, 8, np.full((16, 8), 0.1 * MS), L=0.1 * MS, post=MS)
    assert row == pytest.approx(17 * MS, rel=0.1)


def test_batches_that_do_not_divide_the_envs_and_a_last_short_batch_finish():
    rng = np.random.default_rng(0)
    steps = rng.uniform(0.5, 1.5, size=(12, 5)) * MS
    row = _row(12, 4, 3, 8, steps, L=MS)
    assert MS < row < 12 * MS


def test_the_row_scales_with_its_inputs():
    """Twice as long steps, passes and hand-offs: twice the row (the model simulates in units
    of a mean step and scales back)."""
    rng = np.random.default_rng(1)
    steps = rng.lognormal(0.0, 0.5, size=(32, 16)) * MS
    a = _row(32, 16, 2, 16, steps, L=2 * MS, ipc=0.1 * MS, post=0.05 * MS)
    b = _row(32, 16, 2, 16, 2 * steps, L=4 * MS, ipc=0.2 * MS, post=0.1 * MS)
    assert b == pytest.approx(2 * a, rel=1e-9)
