"""The confirm rounds of the offline Tuner on a heavy-tailed workload (fake executor, fake
clock): every printed ratio must be the long-run one (total steps over total seconds, what a
learner sees), not the median of short samples that mostly miss the rare slow collects."""
from __future__ import annotations

import numpy as np
import pytest

from auturi import Config
from auturi.rollout import CollectStats
from auturi.tuner import Strategy, Tuner
from auturi.tuner.measure import MeasureProtocol, Trial
from tests.helpers import FakeExecutor, FakeRollout

SERIAL = Config.serial(4)
SPREAD = Config(num_actors=2, envs_per_actor=2, policy_batch_size=2)


class HeavyTailExecutor(FakeExecutor):
    """A collect of config ``c`` runs at ``base[c]`` steps/s, except that with probability
    ``tail_prob[c]`` it takes ``tail_factor`` times as long (the rare slow env steps of
    ``HeavyTailEnv`` falling into it). Long-run rate: ``base / (1 + p (F - 1))``."""

    def __init__(self, base: dict, tail_prob: dict, tail_factor: float = 6.0, seed: int = 0):
        super().__init__(4, lambda c: base[c], seed=seed, warmup_factor=1.0, reconfigure_seconds=0.01)
        self.base, self.tail_prob, self.tail_factor = base, tail_prob, tail_factor

    def long_run(self, c: Config) -> float:
        return self.base[c] / (1 + self.tail_prob[c] * (self.tail_factor - 1))

    def collect(self, num_steps: int) -> FakeRollout:
        c = self._config
        slow = self.rng.random() < self.tail_prob[c]
        steps = num_steps * self.num_envs
        seconds = steps / self.base[c] * (self.tail_factor if slow else 1.0)
        self.now += seconds
        self.collects += 1
        return FakeRollout(CollectStats(steps, seconds), self.collects, c, num_steps)


class Only(Strategy):
    """Proposes nothing: the baselines (start, serial) are the contenders."""

    name = "only"

    def propose(self, history):
        return None


# Serial's collects hit slow steps 2 times in 5 (6x as long: its long-run rate is 1/3 of its
# usual one); the spread layout's never do. True speed-up over serial: 1500 / 333.3 = 4.5;
# the median of single collects (most miss the slow steps) says 1500 / 1000 = 1.5.
BASE = {SERIAL: 1000.0, SPREAD: 1500.0}
TAILS = {SERIAL: 0.4, SPREAD: 0.0}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_printed_speedup_is_the_long_run_one_on_a_heavy_tailed_workload(seed):
    ex = HeavyTailExecutor(BASE, TAILS, seed=seed)
    ex.reconfigure(SPREAD)  # the start config
    protocol = MeasureProtocol(min_sample_seconds=0.0, max_samples=10, max_seconds=None)
    result = Tuner(Only(), cache=False, clock=ex.clock, protocol=protocol).tune(ex, 10)
    true = ex.long_run(SPREAD) / ex.long_run(SERIAL)
    assert result.choice == SPREAD and result.choice_trial.source == "confirm"
    assert result.speedup("serial") == pytest.approx(true, rel=0.10), (result.speedup("serial"), true)
    serial = result.reference_trial("serial")
    assert serial.collects_per_sample > 10  # sized from its spread: each sample holds several slow collects
    assert result.choice_trial.collects_per_sample == 1  # a steady config needs no more than one
    assert serial.n >= 3 and result.choice_trial.n >= 3


def test_confirm_rounds_go_on_while_the_intervals_are_wide_and_the_budget_allows():
    """A tight ranking does not end them (their point is the printed ratios); a budget does,
    after 3 samples each."""
    noisy = FakeExecutor(4, lambda c: BASE[c], noise=0.2, seed=5, config=SPREAD)
    protocol = MeasureProtocol(min_sample_seconds=0.0, max_seconds=None)
    result = Tuner(Only(), cache=False, clock=noisy.clock, protocol=protocol, confirm_rounds=6).tune(noisy, 10)
    confirm = [t for t in result.final if t.source == "confirm"]
    assert result.budget["confirm_rounds"] == 6 and all(t.n >= 3 for t in confirm)
    assert all(len(t.collect_rates) >= 6 for t in confirm)
    tight = FakeExecutor(4, lambda c: BASE[c], noise=0.2, seed=5, config=SPREAD)
    result = Tuner(Only(), cache=False, clock=tight.clock, protocol=protocol, budget_seconds=0.5).tune(tight, 10)
    confirm = [t for t in result.final if t.source == "confirm"]
    assert {t.n for t in confirm} == {3}  # the budget is spent: the 3 an interval needs, no more
    assert result.budget["confirm_rounds"] == 1  # one round of 3 samples: the baselines spent the budget


def test_the_record_keeps_each_collect_and_the_sample_length():
    ex = HeavyTailExecutor(BASE, TAILS, seed=0)
    ex.reconfigure(SPREAD)
    protocol = MeasureProtocol(min_sample_seconds=0.0, max_seconds=None)
    result = Tuner(Only(), cache=False, clock=ex.clock, protocol=protocol).tune(ex, 10)
    rec = result.to_record()
    lengths = rec["budget"]["confirm_collects_per_sample"]
    assert lengths[str(SPREAD)] == 1 and lengths[str(SERIAL)] > 10
    confirm = [t for t in rec["final"] if t["source"] == "confirm"]
    assert all(len(t["collect_rates"]) >= t["n"] for t in confirm)
    assert max(len(t["collect_rates"]) for t in confirm) > 3 * 10  # serial's samples are longer
    assert np.isfinite([r for t in confirm for r in t["collect_rates"]]).all()
    back = [Trial.from_dict(t) for t in confirm]  # a results file re-analysed: nothing lost
    assert [(b.collect_rates, b.collects_per_sample) for b in back] == \
        [(t["collect_rates"], t["collects_per_sample"]) for t in confirm]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_budget_caps_the_sample_length(seed):
    """A spread made by a busy machine (or a heavy tail) must not make the confirm rounds
    overrun the budget: without one the serial samples grow to 64 collects (~25 s here)."""
    ex = HeavyTailExecutor(BASE, TAILS, seed=seed)
    ex.reconfigure(SPREAD)
    protocol = MeasureProtocol(min_sample_seconds=0.0, max_seconds=None)
    result = Tuner(Only(), cache=False, clock=ex.clock, protocol=protocol, budget_seconds=4.0).tune(ex, 10)
    assert result.seconds <= 4.0
    serial = result.reference_trial("serial")
    assert 1 < serial.collects_per_sample < 64 and serial.n >= 3


def test_samples_taken_before_the_length_grew_are_regrouped():
    """One-collect samples taken before a slow collect showed would mostly miss the slow
    ones: the trial's collects are regrouped into samples of the final length."""
    from auturi.tuner.measure import regroup

    t = Trial(config=SERIAL, status="ok", collects_per_sample=4)
    t.collect_rates = [100.0, 100.0, 20.0, 100.0] + [100.0, 20.0, 100.0, 100.0] * 2
    t.samples, t.sample_collects = [100.0, 100.0, 20.0, 100.0, 1.0, 1.0], [1, 1, 1, 1, 4, 4]
    regroup(t)
    assert t.sample_collects == [4, 4, 4] and t.samples == [pytest.approx(4 / (3 / 100 + 1 / 20))] * 3
    short = Trial(config=SERIAL, status="ok", collects_per_sample=4, collect_rates=[100.0] * 6,
                  samples=[100.0] * 6, sample_collects=[1] * 6)
    regroup(short)  # 6 collects: samples of 2, so that 3 remain
    assert short.sample_collects == [2, 2, 2]


def test_without_a_budget_the_trial_cap_bounds_the_confirm_rounds():
    """``max_trial_seconds`` caps each config's share of the confirm rounds (a CLI run with
    only --budget-trials once took minutes there on a busy machine)."""
    ex = HeavyTailExecutor(BASE, TAILS, seed=0)
    ex.reconfigure(SPREAD)
    protocol = MeasureProtocol(min_sample_seconds=0.0, max_seconds=1.0)
    result = Tuner(Only(), cache=False, clock=ex.clock, protocol=protocol).tune(ex, 10)
    confirm = [t for t in result.final if t.source == "confirm"]
    assert sum(t.seconds for t in confirm) <= 2 * 1.0 * 1.5 and all(t.n >= 3 for t in confirm)


def test_one_config_and_a_spent_budget_take_no_confirm_rounds():
    """A budget shorter than one collect: the start (serial here) is the one config measured,
    and the choice. Its confirm rounds re-measured it 3 more times with nothing to compare
    (a 1 s budget ran 32 s); they are skipped, its search samples stand. With budget left,
    or more configs, they run as before."""
    ex = FakeExecutor(4, lambda c: BASE[c], noise=0.05, seed=1, config=SERIAL)
    protocol = MeasureProtocol(min_sample_seconds=0.0, max_seconds=None)
    result = Tuner(Only(), cache=False, clock=ex.clock, protocol=protocol, budget_seconds=1e-3).tune(ex, 10)
    assert result.choice == SERIAL and not [t for t in result.final if t.source == "confirm"]
    assert result.choice_trial.source == "start" and result.throughput > 0
    ex = FakeExecutor(4, lambda c: BASE[c], noise=0.05, seed=1, config=SERIAL)
    result = Tuner(Only(), cache=False, clock=ex.clock, protocol=protocol, budget_seconds=60).tune(ex, 10)
    assert [t.n for t in result.final if t.source == "confirm"] == [3]  # time left: measured again
