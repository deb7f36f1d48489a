"""The measurement protocol: statistics, stopping rule, warm-up, caps, the interleaved
re-measure, on :class:`tests.helpers.FakeExecutor`: throughput a known function of the config
plus seeded noise, on a fake clock."""
from __future__ import annotations

import math

import numpy as np
import pytest

from auturi import Config
from auturi.tuner.measure import (
    MeasureProtocol,
    Trial,
    TrialRecorder,
    collects_per_sample,
    measure,
    median_interval,
    ratio,
    remeasure_interleaved,
    sample_throughput,
)
from tests.helpers import FakeExecutor, const


# ---------------------------------------------------------------------------- statistics
def test_an_outlier_does_not_move_the_estimate():
    """The case from the issue: one 670 among ~11,900 steps/s moved the mean by 1,800."""
    base = [11_900.0, 12_050.0, 11_800.0, 11_950.0, 12_000.0]
    m0, *_ = median_interval(base)
    m1, lo, hi, _ = median_interval(base + [670.0])
    assert abs(m1 - m0) <= 100.0  # the median moves by at most half a neighbour gap
    assert abs(sum(base + [670.0]) / 6 - m0) > 1_800.0  # where the mean went
    t = Trial(config=Config.serial(2), samples=base + [670.0], status="ok")
    assert t.estimate == m1 and t.score() == m1 and t.mean < 10_500.0
    assert lo == 670.0 and hi == 12_050.0  # the interval widens instead: it saw the outlier


def test_an_interval_needs_three_samples():
    for xs in ([], [5.0], [5.0, 6.0]):
        m, lo, hi, conf = median_interval(xs)
        assert (lo, hi) == (-math.inf, math.inf) and math.isnan(conf)
        t = Trial(config=Config.serial(2), samples=list(xs), status="ok")
        assert t.half_width == math.inf and t.interval_text() == ""
    assert median_interval([5.0, 6.0])[0] == 5.5
    assert math.isnan(median_interval([])[0])
    m, lo, hi, conf = median_interval([3.0, 1.0, 2.0])
    assert (m, lo, hi) == (2.0, 1.0, 3.0) and conf == pytest.approx(0.75)


def test_the_interval_is_the_order_statistic_one_with_its_exact_confidence():
    # [x(k), x(n+1-k)] covers the median with probability 1 - 2 P(Bin(n, 1/2) < k).
    for n, conf in ((4, 0.875), (5, 0.9375), (6, 1 - 2 / 64)):
        assert median_interval(list(map(float, range(n))))[3] == pytest.approx(conf)
    m, lo, hi, conf = median_interval([float(x) for x in range(1, 11)])  # n=10: k=2 (97.9%), k=3 is 89%
    assert (lo, hi) == (2.0, 9.0) and conf == pytest.approx(1 - 2 * 11 / 1024)
    m, lo, hi, conf = median_interval([float(x) for x in range(1, 21)], level=0.95)
    assert conf >= 0.95 and (lo, hi) == (6.0, 15.0)  # n=20: k=6 (95.9%); k=7 would be 88.5%


def test_coverage_holds_on_a_heavy_tailed_distribution():
    """Distribution-free: on Cauchy-like samples the interval still covers the true median
    at least as often as its confidence says (seeded, so the test is deterministic)."""
    rng = np.random.default_rng(0)
    for n in (3, 6, 9):
        hits, conf = 0, median_interval([0.0] * n)[3]
        for _ in range(2000):
            _, lo, hi, _ = median_interval(1000.0 + 50.0 * rng.standard_cauchy(n))
            hits += lo <= 1000.0 <= hi
        assert hits / 2000 >= conf - 0.03, (n, hits / 2000, conf)


def test_ratio_compares_estimates_and_is_nan_without_a_measurement():
    a = Trial(config=Config.serial(2), samples=[200.0, 210.0, 190.0], status="ok")
    b = Trial(config=Config(num_actors=2, envs_per_actor=1), samples=[100.0, 100.0, 5.0], status="ok")
    assert ratio(a, b) == pytest.approx(2.0)
    assert math.isnan(ratio(a, None)) and math.isnan(ratio(a, Trial(config=Config.serial(2))))


def test_protocol_rejects_settings_that_cannot_work():
    with pytest.raises(ValueError, match="min_samples"):
        MeasureProtocol(min_samples=1)
    with pytest.raises(ValueError, match="max_samples"):
        MeasureProtocol(min_samples=4, max_samples=3)
    with pytest.raises(ValueError, match="rel_half_width"):
        MeasureProtocol(rel_half_width=0.0)


# ---------------------------------------------------------------------------- stopping rule
def test_warmup_is_discarded_and_a_steady_config_converges_at_min_samples():
    target = Config(num_actors=2, envs_per_actor=2)
    ex = FakeExecutor(4, const(1000.0), warmup_factor=0.25, reconfigure_seconds=0.7)
    t = measure(ex, target, 10, MeasureProtocol(min_samples=3, min_sample_seconds=0.0), clock=ex.clock)
    assert t.status == "ok" and t.stop_reason == "converged"
    assert t.warmup == [pytest.approx(250.0)]  # the slow first collect is kept apart...
    assert t.samples == [pytest.approx(1000.0)] * 3  # ...and not in the samples
    assert t.estimate == pytest.approx(1000.0) and t.half_width == pytest.approx(0.0)
    assert t.reconfigure_seconds == pytest.approx(0.7)  # timed apart from throughput
    assert ex.collects == 1 + 3
    assert ex.config == target
    # the trial's seconds cover reconfigure, warm-up and samples
    assert t.seconds == pytest.approx(0.7 + 40 / 250 + 3 * 40 / 1000)


def test_a_noisy_config_hits_max_samples_and_keeps_every_sample():
    ex = FakeExecutor(4, const(1000.0), noise=0.5, seed=1)
    p = MeasureProtocol(rel_half_width=0.01, min_samples=3, max_samples=7, max_seconds=None, min_sample_seconds=0.0)
    t = measure(ex, Config(envs_per_actor=4, env_parallel_degree=2), 10, p, clock=ex.clock)
    assert t.stop_reason == "max_samples"
    assert t.n == 7 and ex.collects == 8
    assert len(set(t.samples)) == 7  # every collect's own value, none dropped
    assert t.half_width > 0.01 * t.estimate


def test_stopping_rule_stops_as_soon_as_the_interval_is_tight_enough():
    tr = Trial(config=Config.serial(2))
    rec = TrialRecorder(tr, MeasureProtocol(rel_half_width=0.05, min_samples=3, max_samples=10), warmup=0)
    assert rec.add(100.0) is False
    assert rec.add(130.0) is False  # two samples: below min_samples regardless
    assert rec.add(70.0) is False   # median 100, interval [70, 130]: keep going
    for _ in range(20):
        if rec.add(100.0):
            break
    assert tr.stop_reason in ("converged", "max_samples")
    m, lo, hi, _ = median_interval(tr.samples)
    assert (max(m - lo, hi - m) <= 0.05 * m) == (tr.stop_reason == "converged")
    assert tr.n <= 10


def test_max_seconds_and_deadline_caps_stop_after_at_least_one_sample():
    ex = FakeExecutor(4, const(40.0), noise=0.3, seed=2)  # 10 steps x 4 envs at 40/s: 1 s per collect
    p = MeasureProtocol(rel_half_width=0.001, max_samples=50, max_seconds=3.5)
    t = measure(ex, Config(num_actors=4, envs_per_actor=1), 10, p, clock=ex.clock)
    assert t.stop_reason == "max_seconds"
    assert 1 <= t.n < 50

    ex2 = FakeExecutor(4, const(40.0), noise=0.3, seed=2)
    t2 = measure(ex2, Config.serial(4), 10, MeasureProtocol(rel_half_width=0.001, max_seconds=None),
                 clock=ex2.clock, deadline=0.0)
    assert t2.stop_reason == "budget" and t2.n == 1


def test_a_config_the_executor_refuses_is_invalid_and_leaves_it_usable():
    ex = FakeExecutor(4, const(1000.0))
    t = measure(ex, Config.serial(8), 10, clock=ex.clock)
    assert t.status == "invalid" and "num_envs=4" in t.error
    assert not t.ok and t.score() == -math.inf
    assert ex.config == Config.serial(4) and ex.collects == 0


def test_a_failing_config_is_recorded_then_raised_unless_asked_not_to():
    bad = Config(envs_per_actor=4, env_parallel_degree=4)
    ex = FakeExecutor(4, const(1000.0))
    ex.fail_on.add(bad)
    t = measure(ex, bad, 10, clock=ex.clock, raise_errors=False)
    assert t.status == "failed" and "worker failed" in t.error
    ex2 = FakeExecutor(4, const(1000.0))
    ex2.fail_on.add(bad)
    with pytest.raises(RuntimeError, match="worker failed"):
        measure(ex2, bad, 10, clock=ex2.clock)


def test_trial_round_trips_through_a_dict_without_inf_or_nan():
    t = Trial(config=Config(num_actors=2, envs_per_actor=2), samples=[5.0], warmup=[1.0], status="ok", source="x")
    d = t.to_dict()
    assert d["half_width"] is None  # inf is not JSON
    back = Trial.from_dict(d)
    assert back.config == t.config and back.samples == [5.0] and back.warmup == [1.0] and back.source == "x"


# ---------------------------------------------------------------------------- interleaving
def test_interleaved_remeasure_alternates_direction_and_warms_up_after_each_reconfigure():
    a, b = Config.serial(4), Config(num_actors=2, envs_per_actor=2)
    speeds = {a: 1000.0, b: 2000.0}
    ex = FakeExecutor(4, lambda c: speeds[c], warmup_factor=0.5)
    trials = remeasure_interleaved(ex, [a, b], 10, MeasureProtocol(), min_rounds=3, max_rounds=3,
                                   clock=ex.clock)
    order = [c for kind, c in ex.log if kind == "reconfigure"]
    # a b | b a | a b: a starts configured; the config ending a round starts the next one
    assert order == [b, a, b]
    assert [t.config for t in trials] == [a, b]
    assert all(t.source == "final" and t.n == 3 and len(t.warmup) == 2 for t in trials)
    assert trials[1].estimate == pytest.approx(2000.0) and trials[0].estimate == pytest.approx(1000.0)
    assert all(w == pytest.approx(0.5 * speeds[t.config]) for t in trials for w in t.warmup)


def test_interleaved_remeasure_stops_early_once_every_interval_is_tight():
    a, b = Config.serial(4), Config(num_actors=2, envs_per_actor=2)
    ex = FakeExecutor(4, const(1000.0))
    trials = remeasure_interleaved(ex, [a, b], 10, MeasureProtocol(), min_rounds=2, max_rounds=6, clock=ex.clock)
    assert all(t.n == 3 and t.stop_reason == "converged" for t in trials)  # 3: the first with an interval


def test_a_clearly_slower_config_stops_early_but_a_close_one_does_not():
    ex = FakeExecutor(4, const(1000.0), noise=0.02, seed=3)
    p = MeasureProtocol(rel_half_width=0.001, max_samples=10, max_seconds=None)
    slow = measure(ex, Config(num_actors=2, envs_per_actor=2), 10, p, clock=ex.clock, reference=5000.0)
    assert slow.stop_reason == "slower" and slow.n == 3 and slow.status == "ok"  # 3: an interval
    close = measure(ex, Config(num_actors=4, envs_per_actor=1), 10, p, clock=ex.clock, reference=990.0)
    assert close.stop_reason == "max_samples" and close.n == 10


def test_interleaved_remeasure_stops_once_the_winner_is_clear():
    a, b = Config.serial(4), Config(num_actors=2, envs_per_actor=2)
    speeds = {a: 1000.0, b: 3000.0}
    ex = FakeExecutor(4, lambda c: speeds[c], noise=0.1, seed=4)
    p = MeasureProtocol(rel_half_width=0.001)  # intervals never get this tight
    trials = remeasure_interleaved(ex, [a, b], 10, p, min_rounds=3, max_rounds=8, clock=ex.clock)
    assert all(t.stop_reason == "separated" for t in trials)
    assert 3 <= trials[0].n < 8


def test_short_collects_are_aggregated_into_one_sample():
    """Offline, a sample lasts at least min_sample_seconds: collects of 40 ms are taken in pairs
    (their steps over their seconds), so a 5 ms collect's jitter is not a whole sample."""
    ex = FakeExecutor(4, const(1000.0), warmup_factor=0.25, reconfigure_seconds=0.0)
    p = MeasureProtocol(min_samples=3, min_sample_seconds=0.05)
    t = measure(ex, Config(num_actors=2, envs_per_actor=2), 10, p, clock=ex.clock)
    assert t.n == 3 and t.samples == [pytest.approx(1000.0)] * 3
    assert ex.collects == 1 + 3 * 2  # one warm-up collect, then two per sample
    with pytest.raises(ValueError, match="min_sample_seconds"):
        MeasureProtocol(min_sample_seconds=-1.0)


# ---------------------------------------------------------------------------- heavy tails
class _MixtureCollects:
    """Collects of 100 steps: 1 ms each, but one in ``1/p`` takes ``factor`` times as long
    (rare slow env steps falling into it); long-run rate ``1e5 / (1 + p (factor - 1))``."""

    def __init__(self, p: float, factor: float, seed: int):
        self.p, self.factor, self.rng, self.now = p, factor, np.random.default_rng(seed), 0.0

    def clock(self) -> float:
        return self.now

    def collect(self, num_steps: int):
        self.now += 1e-3 * (self.factor if self.rng.random() < self.p else 1.0)
        return None  # no stats: sample_throughput times it with the clock


def test_samples_sized_from_the_spread_estimate_a_heavy_tailed_mixture_without_bias():
    """The median of one-collect samples misses the rare slow collects (here 40% too high);
    samples of collects_per_sample() collects each hold several, and their median is the
    long-run rate (total steps over total seconds) within 8% (3 standard errors)."""
    p, factor = 0.2, 3.0
    # Seeded: in these seeds the 9 short samples see the slow collects (in 2 of 20 seeds they
    # see none, and then nothing can size the sample: a spread never seen cannot be measured).
    true = 1e5 / (1 + p * (factor - 1))
    for seed in range(5):
        ex = _MixtureCollects(p, factor, seed)
        seen: list[float] = []
        short = [sample_throughput(ex, 100, 100, 0.0, ex.clock, collect_rates=seen) for _ in range(9)]
        assert median_interval(short)[0] / true - 1 > 0.3  # the old estimate: biased, not noisy
        m = collects_per_sample(seen)
        assert m >= 20
        long = [sample_throughput(ex, 100, 100, 0.0, ex.clock, min_collects=m) for _ in range(15)]
        assert median_interval(long)[0] == pytest.approx(true, rel=0.08), seed


def test_collects_per_sample_grows_with_the_spread_and_is_capped():
    assert collects_per_sample([1000.0, 1000.0]) == 1  # too few collects to see a spread
    assert collects_per_sample([1000.0] * 5) == 1
    lo = collects_per_sample([1000.0, 900.0, 1100.0, 950.0, 1050.0])
    hi = collects_per_sample([1000.0, 500.0, 1100.0, 950.0, 300.0])
    assert 1 <= lo < hi <= 64
    assert collects_per_sample([1000.0, 10.0, 1000.0, 10.0]) == 64


def test_a_sample_takes_at_least_min_collects_collects():
    ex = FakeExecutor(4, const(1000.0), warmup_factor=1.0)
    rates: list[float] = []
    sps = sample_throughput(ex, 10, 40, 0.0, ex.clock, min_collects=5, collect_rates=rates)
    assert ex.collects == 5 and len(rates) == 5 and sps == pytest.approx(1000.0)


def test_interleaved_remeasure_can_go_on_past_a_clear_ranking():
    a, b = Config.serial(4), Config(num_actors=2, envs_per_actor=2)
    speeds = {a: 1000.0, b: 3000.0}
    ex = FakeExecutor(4, lambda c: speeds[c], noise=0.1, seed=4)
    p = MeasureProtocol(rel_half_width=0.001, min_sample_seconds=0.0)
    trials = remeasure_interleaved(ex, [a, b], 10, p, min_rounds=3, max_rounds=5, clock=ex.clock,
                                   stop_when_separated=False, min_collects={a: 2})
    assert [t.n for t in trials] == [5, 5] and all(t.stop_reason == "max_rounds" for t in trials)
    assert len(trials[0].collect_rates) == 10 and len(trials[1].collect_rates) == 5
