"""Online tuning: every collect is the real collect, the budget locks a config in, and a
sustained drop re-opens a local search (FakeExecutor: no processes, fake clock)."""
from __future__ import annotations

import json

import pytest

from auturi import Config
from auturi.tuner import OnlineTuner, build_space
from tests.test_tuner_measure import FakeExecutor

N = 8
SPACE = build_space(N, cores=8, devices=["cpu"])
FAST = Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2)


def speeds(c: Config) -> float:
    """FAST is the best; otherwise more parallel is better, a little."""
    if c == FAST:
        return 3000.0
    return 1000.0 + 100.0 * c.num_actors + 50.0 * c.env_parallel_degree


def grid_online(ex, **kw) -> OnlineTuner:
    """Grid over a space ordered with FAST early, so a small budget reaches it."""
    from auturi.tuner import SearchSpace

    order = [FAST] + [c for c in SPACE.configs if c != FAST]
    space = SearchSpace(totals=SPACE.totals, cores=SPACE.cores, devices=SPACE.devices, configs=order)
    kw.setdefault("min_samples", 2)
    kw.setdefault("max_samples", 4)
    kw.setdefault("search_share", None)  # these tests follow the search back to back
    return OnlineTuner(ex, "grid", space=space, cache=False, clock=ex.clock, **kw)


def test_every_collect_is_the_real_one_and_none_is_extra():
    ex = FakeExecutor(N, speeds, noise=0.01)
    online = grid_online(ex, budget_trials=4)
    rollouts = [online.collect(16) for _ in range(40)]
    assert ex.collects == 40  # the tuner never collects behind the learner's back
    assert [r.index for r in rollouts] == list(range(1, 41))  # each call got its own, fresh rollout
    assert all(r.num_steps == 16 for r in rollouts)
    # warm-up collects after each reconfigure were returned too, just not measured
    measured = sum(t.n + len(t.warmup) for t in online.history)
    assert measured <= 40
    assert all(len(t.warmup) == 1 for t in online.history)


def test_budget_spent_locks_in_the_fastest_measured():
    ex = FakeExecutor(N, speeds, noise=0.01)
    online = grid_online(ex, budget_trials=4)
    for _ in range(40):
        online.collect(16)
    assert online.phase == "locked"
    assert len(online.history) == 4  # start (serial), then three from the grid
    assert online.history[0].source == "start"
    assert online.locked_config == FAST and ex.config == FAST
    assert online.status()["locked_config"] == FAST.to_dict()
    locked_at, reconfigures = ex.collects, ex.reconfigures
    for _ in range(10):
        online.collect(16)
    assert ex.config == FAST and ex.reconfigures == reconfigures  # no more switching after lock-in
    assert ex.collects == locked_at + 10


def test_a_sustained_drop_reopens_a_local_search():
    ex = FakeExecutor(N, speeds, noise=0.01)
    events = []
    online = grid_online(ex, budget_trials=3, drop_fraction=0.2, drop_patience=3, callback=events.append)
    while online.phase != "locked":
        online.collect(16)
    assert online.locked_config == FAST
    online.collect(16)  # the first collect after the lock-in reconfigure is a warm-up, not watched
    ex.slowdown[FAST] = 0.2  # FAST degrades to 600 steps/s: slower than its neighbours now
    for _ in range(2):
        online.collect(16)
    assert online.phase == "locked"  # two slow collects: not yet sustained
    online.collect(16)
    assert online.phase == "research"
    assert [e.kind for e in events].count("drop") == 1
    for _ in range(80):
        online.collect(16)
        if online.phase == "locked":
            break
    assert online.phase == "locked" and online.researches == 1
    new = online.locked_config
    assert new != FAST and new in SPACE.neighbours(FAST)
    assert ex.true_sps(new) > ex.true_sps(FAST)
    research = [t for t in online.history if t.source == "research"]
    assert research[0].config == FAST and research[0].warmup == []  # already running: no warm-up
    assert len(research) <= 6


def test_a_short_dip_does_not_trigger_a_search():
    ex = FakeExecutor(N, speeds, noise=0.01)
    online = grid_online(ex, budget_trials=3, drop_fraction=0.2, drop_patience=3)
    while online.phase != "locked":
        online.collect(16)
    online.collect(16)  # the lock-in warm-up
    for _ in range(3):
        ex.slowdown[FAST] = 0.5
        online.collect(16)
        online.collect(16)
        ex.slowdown[FAST] = 1.0
        online.collect(16)  # recovers before the third slow collect in a row
    assert online.phase == "locked" and online.researches == 0


def test_budget_in_seconds_counts_training_time():
    ex = FakeExecutor(N, speeds, noise=0.01)
    online = grid_online(ex, budget_trials=None, budget_seconds=1.0)
    for _ in range(30):
        online.collect(16)
    assert online.phase == "locked"
    assert 1 <= len(online.history) < len(SPACE)


def test_status_and_result_are_plain_json():
    ex = FakeExecutor(N, speeds, noise=0.01)
    online = grid_online(ex, budget_trials=3)
    s = online.status()
    assert s["phase"] == "idle" and s["collects"] == 0
    online.collect(16)
    s = online.status()
    assert s["mode"] == "online" and s["phase"] == "explore" and s["current_config"] is not None
    json.dumps(s)
    while online.phase != "locked":
        online.collect(16)
    s = online.status()
    json.dumps(s)
    assert s["budget_trials_left"] == 0 and s["best_config"] == FAST.to_dict()
    rec = online.result().to_record()
    json.dumps(rec)
    assert rec["mode"] == "online" and rec["choice"]["config"] == FAST.to_dict()
    assert len(rec["trials"]) == 3


def test_online_rejects_bad_settings():
    ex = FakeExecutor(N, speeds)
    with pytest.raises(ValueError, match="drop_fraction"):
        OnlineTuner(ex, "grid", drop_fraction=1.5, cache=False)
    with pytest.raises(ValueError, match="budget_trials"):
        OnlineTuner(ex, "grid", budget_trials=0, cache=False)


def test_a_config_the_executor_refuses_is_skipped_online():
    from auturi import ConfigError

    class Picky(FakeExecutor):
        def reconfigure(self, config):
            if config == FAST:
                raise ConfigError("num_actors", 2, "not on this machine")
            return super().reconfigure(config)

    ex = Picky(N, speeds, noise=0.01)
    online = grid_online(ex, budget_trials=4)
    for _ in range(40):
        online.collect(16)
    assert ex.collects == 40
    assert [t.status for t in online.history].count("invalid") == 1
    assert online.history[1].config == FAST and online.history[1].status == "invalid"
    assert online.phase == "locked" and online.locked_config != FAST


def test_search_share_bounds_what_the_search_costs_and_the_search_still_finishes():
    """16 envs x 16 steps take ~0.1 s; each reconfigure 0.5 s: back to back the search would
    cost most of a short run. With a 10% share it pauses on the best config so far, never
    runs over its share by more than one trial, and finishes later."""
    ex = FakeExecutor(N, speeds, noise=0.01)
    online = grid_online(ex, budget_trials=6, search_share=0.1)
    phases, over = [], []
    for _ in range(3000):
        online.collect(16)
        phases.append(online.phase)
        elapsed = ex.clock() - online.t0
        over.append(online.search_cost - 0.1 * elapsed)
        if online.phase == "paused":
            best = online.best()
            assert ex.config == best.config  # the fastest measured so far runs meanwhile
    assert "paused" in phases and phases[-1] == "locked"
    assert online.locked_config == FAST and len(online.history) == 6
    # The share is checked between trials: it can be exceeded by one trial (its reconfigure
    # and its warm-up plus at most 4 samples, at worst at the slowest speed) and the switch back.
    one_trial = 2 * ex.reconf_s + 5 * 16 * N / 1000.0
    assert max(over) < one_trial, max(over)
    assert over[-1] < 0.05 * ex.clock()  # and over a long run it stays within the share
    assert online.status()["search_cost_seconds"] == online.search_cost > 0


def test_without_a_share_the_search_never_pauses():
    ex = FakeExecutor(N, speeds, noise=0.01)
    online = grid_online(ex, budget_trials=6, search_share=None)
    phases = [(online.collect(16), online.phase)[1] for _ in range(60)]
    assert "paused" not in phases and phases[-1] == "locked"


def test_search_share_must_be_a_fraction():
    with pytest.raises(ValueError, match="search_share"):
        OnlineTuner(FakeExecutor(N, speeds), "grid", cache=False, search_share=0)
