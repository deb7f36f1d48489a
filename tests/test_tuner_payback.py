"""The online tuner's payback rule as pure functions (auturi.tuner.payback): what a move
saves, what it costs, and when a record's declined move pays back for a longer run."""
from __future__ import annotations

import math

import pytest

from auturi.tuner.payback import (
    DISCOUNT_PRIOR,
    PROCESS_START_PRIOR,
    RECONFIGURE_BASE,
    SERVER_START_PRIOR,
    benefit_per_collect,
    cached_search_open,
    declined_now_paying,
    discount,
    payback,
    pays_back,
    realized_fraction,
    reconfigure_estimate,
)


def test_the_reconfigure_estimate_learns_the_seconds_per_started_process():
    assert reconfigure_estimate([], 4) == pytest.approx(RECONFIGURE_BASE + 4 * PROCESS_START_PRIOR)
    log = [{"seconds": 0.4, "executor": {"started": 4}}, {"seconds": 0.3, "executor": {"started": 1}},
           {"seconds": 0.5, "executor": {"started": 2}}]
    assert reconfigure_estimate(log, 10) == pytest.approx(RECONFIGURE_BASE + 10 * 0.25)  # the median of .1 .3 .25
    assert reconfigure_estimate(log, 0) == pytest.approx(RECONFIGURE_BASE)  # back to fewer processes


def test_a_reconfigure_that_started_a_server_or_nothing_teaches_no_process_cost():
    cold = [{"seconds": 3.0, "executor": {"started": 2}, "cold": True}]
    assert reconfigure_estimate(cold, 2) == pytest.approx(RECONFIGURE_BASE + 2 * PROCESS_START_PRIOR)
    nothing = [{"seconds": 0.01, "executor": {"started": 0}}]  # a batch change: no per-process figure
    assert reconfigure_estimate(nothing, 2) == pytest.approx(RECONFIGURE_BASE + 2 * PROCESS_START_PRIOR)
    silent = [{"seconds": 0.8}, {"seconds": 0.2}, {"seconds": 0.4}]  # an executor that does not say
    assert reconfigure_estimate(silent, 7) == pytest.approx(0.4)


def test_the_benefit_per_collect_is_the_discounted_gain_and_nothing_within_noise():
    # 20% faster than 1,000 steps/s, 500 steps a collect (0.5 s): saves 0.1 s, half believed
    assert benefit_per_collect(1250.0, 1000.0, collect_steps=500, discount=0.5, min_gain=0.05) == pytest.approx(0.05)
    assert benefit_per_collect(1040.0, 1000.0, collect_steps=500, discount=1.0, min_gain=0.05) == 0.0
    assert benefit_per_collect(900.0, 1000.0, collect_steps=500, discount=1.0, min_gain=0.0) == 0.0  # slower
    for pred, best in ((None, 1000.0), (math.inf, 1000.0), (1250.0, None), (1250.0, 0.0)):
        assert benefit_per_collect(pred, best, collect_steps=500, discount=1.0, min_gain=0.0) == 0.0


def test_a_moves_payback_weighs_the_collects_left_against_both_ways_and_the_warm_up():
    kw = dict(per_collect=0.05, warmup_collects=1, collect_seconds=0.5, there_seconds=0.33, back_seconds=0.03)
    benefit, cost = payback(left=100, **kw)
    assert benefit == pytest.approx(0.05 * 99)  # the warm-up collect gains nothing
    assert cost == pytest.approx(0.33 + 0.03 + 0.5 * 0.5 * 2)  # warm-up and first sample at half speed
    assert pays_back(benefit, cost)
    short = payback(left=10, **kw)
    assert not pays_back(*short)  # the same move with 10 collects to go
    assert payback(left=100, **kw, server_start=True)[1] == pytest.approx(cost + SERVER_START_PRIOR)
    # once search trials ran, a move costs at least what they cost on average
    assert payback(left=100, **kw, search_trials=2, trial_cost=9.0)[1] == pytest.approx(4.5)
    assert payback(left=100, **kw, search_trials=2, trial_cost=0.1)[1] == pytest.approx(cost)
    assert payback(left=100, **{**kw, "per_collect": 0.0}) == (0.0, 0.0)  # nothing to weigh


def test_pays_back_needs_a_positive_benefit_and_the_factor():
    assert pays_back(1.0, 0.5) and not pays_back(1.0, 0.5, factor=2.0) and pays_back(1.1, 0.5, factor=2.0)
    assert not pays_back(0.0, 0.0) and not pays_back(0.5, 0.5)


def test_the_discount_follows_how_much_of_their_promise_trials_delivered():
    assert discount([]) == DISCOUNT_PRIOR
    assert discount([1.0, 1.0, 1.0]) == pytest.approx((DISCOUNT_PRIOR + 3) / 4)
    assert discount([0.0] * 9) == pytest.approx(DISCOUNT_PRIOR / 10)  # an over-promising model stops being believed
    assert realized_fraction(0.2, 1000.0, 1250.0) == pytest.approx(1.0)  # promised 20%, got 20%
    assert realized_fraction(0.4, 1000.0, 1250.0) == pytest.approx(0.5)
    assert realized_fraction(0.2, 1000.0, 800.0) == 0.0 and realized_fraction(0.2, 1000.0, None) == 0.0
    assert realized_fraction(0.1, 1000.0, 2000.0) == 1.0  # clipped


def test_a_declined_move_pays_back_over_more_collects():
    d = {"config": {"num_actors": 2, "envs_per_actor": 4}, "benefit_seconds": 0.5, "cost_seconds": 2.0,
         "collects_left": 10}
    assert declined_now_paying([d], 10) is None and declined_now_paying([d], 100) is d  # 0.05 s per collect
    assert declined_now_paying([d], None) is d  # unknown length: any with a benefit
    broken = {"benefit_seconds": "x"}
    assert declined_now_paying([broken, d], 100) is d  # a malformed record entry is skipped


def test_a_cached_records_search_stays_open_for_a_longer_run_only():
    d = {"config": {"num_actors": 2, "envs_per_actor": 4}, "benefit_seconds": 0.0, "benefit_per_collect": 0.05,
         "cost_seconds": 2.0, "collects_left": 1}
    assert cached_search_open(None, 1000) is None  # an offline record searched whatever the length
    assert "ended before it locked in" in cached_search_open({"locked": False}, 5)
    assert cached_search_open({"locked": True, "declined": [d]}, 30) is None
    why = cached_search_open({"locked": True, "declined": [d]}, 100)
    assert "declined actors=2 x envs=4" in why and "100 collects" in why
