"""Online tuning: every collect is the real collect, the budget locks a config in, and a
sustained drop re-opens a local search (FakeExecutor: no processes, fake clock)."""
from __future__ import annotations

import json

import pytest

from auturi import Config
from auturi.executor.contract import MoveCost, planned_move_cost
from auturi.tuner import OnlineTuner, build_space
from auturi.tuner.strategies import ModelStrategy
from tests.helpers import FakeExecutor

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
    online = grid_online(ex, budget_trials=3, drop_fraction=0.2, drop_patience=3, callback=events.append,
                         monitor_seconds=0)  # one collect, one monitor sample
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


@pytest.mark.parametrize("refusal", ["config", "lost_changes"])
def test_a_config_the_executor_refuses_is_skipped_online(refusal):
    """A layout the executor refuses before changing anything is an invalid trial and the
    search goes on: a config this machine cannot run, or a move that would recreate envs a
    curriculum changed through ``env_method`` (it failed the training's ``learn`` before)."""
    from auturi import ConfigError
    from auturi.errors import LostEnvChangesError

    class Picky(FakeExecutor):
        def reconfigure(self, config):
            if config == FAST:
                if refusal == "config":
                    raise ConfigError("num_actors", 2, "not on this machine")
                raise LostEnvChangesError([3], "this env does not move with its state")
            return super().reconfigure(config)

    ex = Picky(N, speeds, noise=0.01)
    online = grid_online(ex, budget_trials=4)
    for _ in range(40):
        online.collect(16)
    assert ex.collects == 40
    assert [t.status for t in online.history].count("invalid") == 1
    assert online.history[1].config == FAST and online.history[1].status == "invalid"
    assert online.phase == "locked" and online.locked_config != FAST


def test_a_move_that_lost_changes_midway_ends_the_run_with_the_error():
    """Found during the move (an env stopped pickling while it stepped), the executor has
    closed: the error reaches the caller, nothing is retried on a closed executor."""
    from auturi.errors import LostEnvChangesError

    class Broken(FakeExecutor):
        def reconfigure(self, config):
            if config == FAST:
                raise LostEnvChangesError([3], "its pickle failed during the move", intact=False)
            return super().reconfigure(config)

    online = grid_online(Broken(N, speeds, noise=0.01), budget_trials=4)
    with pytest.raises(LostEnvChangesError, match=r"env\(s\) \[3\]"):
        for _ in range(40):
            online.collect(16)


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


# ---------------------------------------------------------------------------- issue 15: pays for itself
from auturi.rollout import CollectStats  # noqa: E402
from auturi.tuner.profile import Profile, predict  # noqa: E402

N16 = 16
SPACE16 = build_space(N16, cores=2, devices=["cpu"])
# The truth the fake runs by: the model itself on a known profile (defaults for what the
# rollouts cannot time), so a profile recovered from the rollouts predicts it exactly.
TRUE = Profile(env_step_seconds=2e-4, policy_seconds={"cpu": {N16: 4e-4}}, cores=2)


class ProfiledFake(FakeExecutor):
    """Runs at ``predict(config, TRUE)`` and reports, under an in-process layout, the env and
    policy time of each collect as a real executor's stats do."""

    def __init__(self, truth=lambda c: predict(c, TRUE), **kw):
        super().__init__(N16, truth, **kw)

    def collect(self, num_steps):
        r = super().collect(num_steps)
        c = self.config
        if c.num_actors == 1 and c.env_parallel_degree == 1 and c.policies_per_actor == 1:
            r.stats.env_seconds = r.stats.steps * TRUE.env_step_seconds
            r.stats.policy_seconds = num_steps * -(-c.envs_per_actor // c.policy_batch_size) * 4e-4
        return r


def model_online(ex, **kw) -> OnlineTuner:
    kw.setdefault("cache", False)
    return OnlineTuner(ex, "model", space=SPACE16, clock=ex.clock, **kw)


def run_until(online, ex, seconds: float, num_steps: int = 64) -> None:
    while ex.clock() < seconds:
        online.collect(num_steps)


def test_the_first_rollouts_profile_leads_straight_to_the_predicted_best():
    ex = ProfiledFake()
    online = model_online(ex)
    run_until(online, ex, 300.0)
    best = max(SPACE16.configs, key=lambda c: predict(c, TRUE))
    assert best != Config.serial(N16)
    assert online.profile_source == "rollouts"
    prof = online.strategy.profile
    assert prof.env_step_seconds == pytest.approx(TRUE.env_step_seconds)
    assert prof.policy_latency("cpu", N16) == pytest.approx(4e-4)
    assert [t.source for t in online.history[:2]] == ["start", "online"]  # start IS serial: measured once
    assert online.history[1].config == best  # the second trial is already the predicted best
    assert online.phase == "locked" and online.locked_config == best
    assert len(online.history) <= 6  # only the few the prediction cannot separate


def test_a_cached_choice_runs_from_the_first_collect_and_is_only_confirmed(tmp_path, capsys):
    first = ProfiledFake()
    online = model_online(first, cache=tmp_path)
    run_until(online, first, 300.0)
    choice = online.locked_config
    assert choice is not None and choice != Config.serial(N16)
    assert "starting from the layout cached" not in capsys.readouterr().err  # nothing cached yet

    ex = ProfiledFake()
    again = model_online(ex, cache=tmp_path)
    again.collect(64)
    said = capsys.readouterr().err  # the user is told where the layout came from, and how to opt out
    assert f"starting from the layout cached in {tmp_path}" in said and str(choice) in said
    assert "'cache': False" in said
    assert ex.log[:2] == [("reconfigure", choice), ("collect", choice)]  # before the first collect
    for _ in range(10):
        again.collect(64)
    assert again.phase == "locked" and again.locked_config == choice
    assert [t.source for t in again.history] == ["cache"]  # confirmed, not re-searched
    assert ex.reconfigures == 1
    assert again.first_run_cost()["collects_off_choice"] == 0


def test_a_cached_choice_that_no_longer_holds_is_searched_from_the_start(tmp_path):
    first = ProfiledFake()
    online = model_online(first, cache=tmp_path)
    run_until(online, first, 300.0)
    choice = online.locked_config
    ex = ProfiledFake()
    ex.slowdown[choice] = 0.5  # the machine changed: the cached figure is not met
    again = model_online(ex, cache=tmp_path)
    run_until(again, ex, 300.0)
    assert again.history[0].source == "cache" and again.history[1].source == "start"
    assert again.phase == "locked" and again.locked_config != choice


def test_on_a_short_run_the_search_costs_a_few_percent_and_a_long_run_locks_in():
    """16 envs x 64 steps, rollouts of ~0.1-0.3 s, reconfigures of 0.5 s: a ~30 s run."""
    ex = ProfiledFake(noise=0.03)
    online = model_online(ex)
    run_until(online, ex, 30.0)
    elapsed = ex.clock() - online.t0
    assert online.search_cost <= 0.05 * elapsed + 2 * ex.reconf_s  # the share, plus one trial's switch
    cost = online.first_run_cost()
    assert cost["reconfigure_seconds"] <= 0.1 * elapsed
    run_until(online, ex, 600.0)
    assert online.phase == "locked"
    best = max(SPACE16.configs, key=lambda c: predict(c, TRUE))
    assert ex.true_sps(online.locked_config) >= 0.95 * ex.true_sps(best)
    assert online.search_cost <= 0.05 * (ex.clock() - online.t0)


def test_first_run_cost_is_in_the_record_and_the_status():
    ex = ProfiledFake()
    online = model_online(ex)
    run_until(online, ex, 300.0)
    choice = online.locked_config
    rec = online.result().to_record()
    json.dumps(rec)
    first = rec["online"]["first_run"]
    off = [c for kind, c in ex.log if kind == "collect" and c != choice]
    assert first["collects_off_choice"] == len(off) > 0
    assert first["collects"] == ex.collects and first["reconfigures"] == ex.reconfigures
    assert first["collects_to_lock"] is not None and first["collects_to_lock"] > len(off) - 1
    assert first["seconds_off_choice"] > 0  # serial ran before the faster choice
    assert online.status()["first_run"] == online.first_run_cost()
    # kept as totals per config, not a record per collect (off-policy runs make millions)
    assert len(online._log) == len({c for kind, c in ex.log if kind == "collect"}) < ex.collects
    from auturi.tuner.cache import check_record

    check_record(rec)  # the cache accepts the new fields


def test_the_executors_reconfigure_report_is_kept_per_trial():
    class Reporting(ProfiledFake):
        def reconfigure(self, config):
            s = super().reconfigure(config)
            self.last_reconfigure = {"seconds": s, "kept": 1, "started": 2, "ended": 0, "moved": 4, "recreated": 0}
            return s

    ex = Reporting()
    online = model_online(ex)
    run_until(online, ex, 10.0)
    switched = [t for t in online.history if t.source == "online"]
    assert switched and switched[0].reconfigure["started"] == 2
    assert online.result().to_record()["trials"][1]["reconfigure"]["moved"] == 4
    assert online.status()["last_reconfigure"]["executor"]["kept"] == 1


def test_a_trial_clearly_slower_than_the_best_stops_after_one_sample():
    slow = Config(num_actors=1, envs_per_actor=N, env_parallel_degree=N)

    def truth(c):
        return 300.0 if c == slow else speeds(c)

    from auturi.tuner import SearchSpace

    space = SearchSpace(totals=SPACE.totals, cores=SPACE.cores, devices=SPACE.devices,
                        configs=[slow] + [c for c in SPACE.configs if c != slow])
    ex = FakeExecutor(N, truth, noise=0.01)
    online = OnlineTuner(ex, "grid", space=space, cache=False, clock=ex.clock, budget_trials=3, search_share=None)
    for _ in range(20):
        online.collect(16)
    t = next(t for t in online.history if t.config == slow)
    assert t.stop_reason == "slower" and t.n == 1 and len(t.warmup) == 1


@pytest.mark.parametrize("start", [Config.serial(N16), Config(num_actors=2, envs_per_actor=8, policy_batch_size=4)])
def test_the_lock_in_is_never_slower_than_start_or_serial(start):
    """Every other layout is slower than serial (a big network, say), and the model is
    wrong about it: the lock-in is still start or serial, whichever measured faster."""
    def truth(c):
        return 5000.0 if c == Config.serial(N16) else (4800.0 if c == start else 0.6 * predict(c, TRUE))

    ex = ProfiledFake(truth=truth, noise=0.02, config=start)
    online = model_online(ex)
    run_until(online, ex, 300.0)
    assert online.phase == "locked"
    base = [t for t in online.history if t.source in ("start", "serial")]
    assert {t.config for t in base} == {start, Config.serial(N16)}
    assert online.locked.estimate >= max(t.estimate for t in base)
    assert online.locked_config == Config.serial(N16)


def test_on_a_real_executor_the_profile_comes_from_its_rollouts():
    """The serial backend's collect stats and its env/policy give the model its profile,
    at every batch size of the space, without profile_executor's stepping."""
    import gymnasium as gym

    import auturi
    from auturi.envs import CountingEnv

    with auturi.make_executor(CountingEnv, auturi.RandomPolicy(gym.spaces.Discrete(3)), 4, backend="serial") as ex:
        online = OnlineTuner(ex, cache=False, min_sample_seconds=0)  # a sample per collect, however short
        for _ in range(12):
            online.collect(16)
        assert online.profile_source == "rollouts"
        prof = online.strategy.profile
        assert set(prof.policy_seconds["cpu"]) == set(online.space.values("policy_batch_size"))
        assert prof.env_step_seconds > 0 and online.history[0].source == "start"


# ---------------------------------------------------------------------------- moves that pay back
def test_with_few_collects_left_no_move_is_tried_and_serial_is_locked_in():
    """The caller says 8 collects remain: the predicted best's gain over them is far below
    what trying it costs (0.5 s per reconfigure here), so the tuner stays where it is."""
    ex = ProfiledFake()
    online = model_online(ex)
    for left in range(8, 0, -1):
        online.collect(64, remaining_collects=left)
    assert ex.reconfigures == 0  # every collect ran under the start layout
    assert online.phase == "locked" and online.locked_config == Config.serial(N16)
    assert online.declined, "the skipped move must be on record"
    d = online.declined[0]
    assert d["benefit_seconds"] <= d["cost_seconds"] and d["collects_left"] < 8
    assert online.result().online["declined"] == online.declined


def test_a_moves_payback_counts_the_trials_own_collects_and_the_way_back_at_its_price():
    """A trial's measured collects run at the new layout: a move's benefit is every collect
    left after its warm-up, at the predicted gain times the discount (one half before any
    trial); its cost prices the way there and the way back each by the processes it starts
    (back to serial: none), plus the warm-up and first collect at half speed."""
    from auturi.tuner.online import PROCESS_START_PRIOR, RECONFIGURE_BASE

    ex = ProfiledFake()
    online = model_online(ex)
    for left in range(8, 0, -1):  # too short for any move: each is priced and declined
        online.collect(64, remaining_collects=left)
    serial = Config.serial(N16)
    assert ex.config == serial and online.declined
    warm = online._warmup_collects()
    priced = [d for d in online.declined if d["cost_seconds"] > 0]  # not a gain under min_gain
    assert priced
    for d in priced:
        c = Config(**d["config"])
        started = online._started_processes(c, serial)
        assert started > 0 and online._started_processes(serial, c) == 0
        collect_s = 64 * N16 / d["best"]
        gain = 1 - d["best"] / d["predicted"]
        assert d["benefit_seconds"] == pytest.approx(0.5 * gain * collect_s * (d["collects_left"] - warm))
        there = RECONFIGURE_BASE + started * PROCESS_START_PRIOR
        assert d["cost_seconds"] == pytest.approx(there + RECONFIGURE_BASE + 0.5 * collect_s * (warm + 1))


def test_a_choice_a_short_run_cached_binds_runs_as_short_but_not_a_longer_one(tmp_path):
    """A short run declines the predicted best (it would not pay back in 8 collects) and caches
    serial: a run as short takes it as it is; a long one confirms it, then searches on
    from it, because the declined move pays back over its collects."""
    short = model_online(ProfiledFake(), cache=tmp_path)
    for left in range(8, -1, -1):
        short.collect(64, remaining_collects=left)
    assert short.locked_config == Config.serial(N16) and short.declined
    assert short.result().online["locked"] is True

    import shutil

    shutil.copytree(tmp_path, tmp_path.parent / "short_only")
    again = model_online(ProfiledFake(), cache=tmp_path.parent / "short_only")
    for left in range(8, -1, -1):
        again.collect(64, remaining_collects=left)
    assert [t.source for t in again.history] == ["cache"]  # as short: the record is its answer
    left = 2000  # ... until it learns again for longer: the cached run's declined move pays back now
    while left >= 0 and (left == 2000 or again.phase != "locked"):
        again.collect(64, remaining_collects=left)
        left -= 1
    assert again.locked_config == max(SPACE16.configs, key=lambda c: predict(c, TRUE))

    ex = ProfiledFake()
    events = []
    long = model_online(ex, cache=tmp_path, callback=events.append)
    best = max(SPACE16.configs, key=lambda c: predict(c, TRUE))
    left = 2000
    while long.phase != "locked":
        long.collect(64, remaining_collects=left)
        left -= 1
    assert long.history[0].source == "cache" and long.history[0].config == Config.serial(N16)
    assert long.locked_config == best  # found by searching on, not inherited
    assert any("searching on" in e.message for e in events)
    rerun = model_online(ProfiledFake(), cache=tmp_path)  # the longer run's record replaced the short one's
    rerun.collect(64, remaining_collects=2000)
    assert rerun.cached is not None and rerun.cached[0] == best


def test_a_move_declined_for_a_short_learn_is_tried_when_learn_is_called_again_for_longer():
    """learn(short) declines the predicted best and locks serial; a second learn() (a loop of
    learn(..., reset_num_timesteps=False)) with many collects left searches on and moves;
    a second call as short as the first does not."""
    best = max(SPACE16.configs, key=lambda c: predict(c, TRUE))
    for second, moves in ((8, False), (2000, True)):
        ex = ProfiledFake()
        online = model_online(ex)
        for left in range(8, -1, -1):
            online.collect(64, remaining_collects=left)
        assert online.phase == "locked" and online.locked_config == Config.serial(N16) and online.declined
        left = second
        while left >= 0 and (left == second or online.phase != "locked"):
            online.collect(64, remaining_collects=left)
            left -= 1
        assert (online.locked_config == best) is moves
        assert (ex.reconfigures > 0) is moves


def test_with_many_collects_left_the_predicted_best_is_tried():
    ex = ProfiledFake()
    online = model_online(ex)
    best = max(SPACE16.configs, key=lambda c: predict(c, TRUE))
    left = 2000
    while online.phase != "locked":
        online.collect(64, remaining_collects=left)
        left -= 1
    assert online.history[1].config == best and online.locked_config == best
    assert not online.declined or all(d["config"] != best.to_dict() for d in online.declined)


def test_the_reconfigure_estimate_learns_from_this_runs_reconfigures():
    ex = ProfiledFake(reconfigure_seconds=2.0)
    online = model_online(ex)
    run_until(online, ex, 300.0)
    two = Config(num_actors=1, envs_per_actor=N16, env_parallel_degree=2)
    from auturi.tuner.online import PROCESS_START_PRIOR

    est = online._reconfigure_estimate(two)
    assert est > 5 * PROCESS_START_PRIOR  # the fake's 2 s per reconfigure, not the prior


class WarmingFake(ProfiledFake):
    """Its worker servers start at ``prepare`` (the executor contract's, for any layout that
    starts processes) and serve ``warm_collects`` collects later."""

    def __init__(self, warm_collects: int = 5, **kw):
        super().__init__(**kw)
        self.warm_calls, self.warm_left, self.warm_collects = 0, None, warm_collects
        self.configs_while_warming: list[Config] = []

    def prepare(self, config):
        self.warm_calls += 1
        self.warm_left = self.warm_collects

    def move_cost(self, config, origin=None):
        cost = planned_move_cost(self.config if origin is None else origin, config)
        return MoveCost(cost.processes, int(bool(cost.processes) and not self.warm_calls))

    @property
    def warming(self) -> bool:
        return bool(self.warm_left)

    def collect(self, num_steps):
        if self.warm_left:
            self.configs_while_warming.append(self.config)
            self.warm_left -= 1
        return super().collect(num_steps)


def test_worker_servers_start_only_before_the_first_trial_that_starts_processes_and_it_waits_for_them():
    ex = WarmingFake(warm_collects=5)
    online = model_online(ex)
    assert ex.warm_calls == 0  # creating the tuner starts nothing: serial may stay the best
    start = ex.config
    run_until(online, ex, 300.0)
    assert ex.warm_calls == 1
    # Collected (the learner got them), not measured; the collect during which the servers
    # came up is not measured either: after it the waiting trial starts.
    assert online.warming_collects == 4
    assert ex.configs_while_warming == [start] * 5  # the trial waited on the start layout
    assert [t.config for t in online.history][:1] == [start]
    assert len(online.history) >= 2 and online.phase == "locked"


class TwoServerFake(FakeExecutor):
    """Env workers fork from one server, policy processes from another (the shm executor's
    ``env`` and ``torch`` forkservers); each serves ``warm[server]`` collects after its start."""

    def __init__(self, warm: dict, **kw):
        super().__init__(N, speeds, **kw)
        self.warm = warm
        self.left: dict[str, int] = {}  # server -> collects until it serves
        self.reconfigured_while: list[tuple[Config, set, int]] = []  # (to, servers importing, collects before)

    @staticmethod
    def servers(config):
        need = set()
        if config.env_parallel_degree > 1:
            need.add("env")
        if config.num_actors > 1 or config.policies_per_actor > 1:
            need.add("torch")
        return need

    def prepare(self, config):
        for s in self.servers(config):
            self.left.setdefault(s, self.warm[s])

    def move_cost(self, config, origin=None):
        processes = planned_move_cost(self.config if origin is None else origin, config).processes
        return MoveCost(processes, len(self.servers(config) - set(self.left)) if processes else 0)

    @property
    def warming(self) -> bool:
        return any(v > 0 for v in self.left.values())

    def reconfigure(self, config):
        self.reconfigured_while.append((config, {s for s, v in self.left.items() if v > 0}, self.collects))
        return super().reconfigure(config)

    def collect(self, num_steps):
        self.left = {s: max(0, v - 1) for s, v in self.left.items()}
        return super().collect(num_steps)


def test_each_worker_server_starts_before_the_first_trial_that_forks_from_it():
    """A trial of env workers waits for the env workers' server only (gymnasium: a fraction of
    a second), not for the policy processes' (torch: seconds); a later trial needing that one
    waits for it then, the training collecting on the layout it had meanwhile."""
    from auturi.tuner import SearchSpace

    degree = Config(num_actors=1, envs_per_actor=N, env_parallel_degree=4)
    actors = Config(num_actors=2, envs_per_actor=N // 2, env_parallel_degree=2)
    ex = TwoServerFake(warm={"env": 2, "torch": 6})
    space = SearchSpace(totals=(N,), cores=8, devices=("cpu",), configs=[Config.serial(N), degree, actors])
    online = OnlineTuner(ex, "grid", space=space, cache=False, clock=ex.clock, min_samples=2, max_samples=2,
                         search_share=None, min_sample_seconds=0)
    for _ in range(60):
        online.collect(16)
    assert [t.config for t in online.history] == [Config.serial(N), degree, actors]
    # each reconfigure came once the server of its processes served, and the first one waited
    # for the env workers' server only
    start_trial = online.history[0].n + len(online.history[0].warmup)
    assert ex.reconfigured_while[0] == (degree, set(), start_trial + 2)
    assert ex.reconfigured_while[1][:2] == (actors, set())
    assert online.warming_collects == (2 - 1) + (6 - 1)  # each server's imports: collected, not measured
    assert online.phase == "locked"


def test_a_long_unmeasured_warm_up_starts_the_env_workers_server_ahead_and_no_trial_waits_for_it():
    """Collects not to measure (an off-policy warm-up) that last ``warm_ahead_seconds`` start
    the env workers' server (not torch's); the search's first trial of env workers then
    starts right after the start trial, instead of waiting for the server's imports."""
    from auturi.tuner import SearchSpace

    degree = Config(num_actors=1, envs_per_actor=N, env_parallel_degree=4)
    ex = TwoServerFake(warm={"env": 2, "torch": 6})
    space = SearchSpace(totals=(N,), cores=8, devices=("cpu",), configs=[Config.serial(N), degree])
    online = OnlineTuner(ex, "grid", space=space, cache=False, clock=ex.clock, min_samples=2, max_samples=2,
                         search_share=None, min_sample_seconds=0, warm_ahead_seconds=0.5)
    online.begin(16)
    before = 0.0
    for _ in range(50):
        if ex.left:
            break
        before = ex.clock()
        online.collect(16, measure=False)
    assert before < 0.5 <= ex.clock() and set(ex.left) == {"env"}  # at the threshold, env workers' only
    for _ in range(3):  # the rest of the warm-up: the server serves meanwhile
        online.collect(16, measure=False)
    while online.phase != "locked":
        online.collect(16)
    start = online.history[0]
    assert ex.reconfigured_while[0] == (degree, set(), online.unmeasured_collects + start.n + len(start.warmup))
    assert online.warming_collects == 0 and set(ex.left) == {"env"}


@pytest.mark.parametrize("case", ["short", "off", "one_env"])
def test_no_server_starts_ahead_for_a_short_warm_up_when_off_or_with_one_env(case):
    if case == "one_env":
        ex = FakeExecutor(1, lambda c: 1000.0)
        ex.move_cost = lambda config, origin=None: MoveCost(processes=1, cold_servers=1)  # were there a layout
        ex.prepare = lambda config: pytest.fail("one env: no layout of env workers to warm for")
    else:
        ex = TwoServerFake(warm={"env": 2, "torch": 6})
    online = OnlineTuner(ex, "grid", cache=False, clock=ex.clock, search_share=None, min_sample_seconds=0,
                         warm_ahead_seconds=None if case == "off" else (100.0 if case == "short" else 0.1))
    online.begin(16)
    for _ in range(20):
        online.collect(16, measure=False)
    assert ex.clock() > 0.1 and getattr(ex, "left", {}) == {}


def test_a_trials_warm_up_is_decided_by_its_own_first_collect_not_the_layout_it_left():
    """Serial collects of 1.3-2.6 s, then a trial of a layout whose first collect takes 0.85 s:
    that trial keeps its warm-up (the long collects were the old layout's)."""
    ex = FakeExecutor(N, speeds, noise=0.0)  # the first collect after a reconfigure runs at half speed
    online = grid_online(ex, budget_trials=4, self_warming_seconds=1.0)
    while online.phase != "locked":
        online.collect(160)  # 1,280 steps
    first_seconds = {t.config: 1280 / (0.5 * speeds(t.config)) for t in online.history}
    assert first_seconds[FAST] < 1.0 < first_seconds[Config.serial(N)]
    assert [len(t.warmup) for t in online.history] == [0 if first_seconds[t.config] >= 1.0 else 1
                                                       for t in online.history]


def test_collects_not_to_measure_are_the_learners_but_no_trials():
    ex = FakeExecutor(N, speeds, noise=0.0)
    online = grid_online(ex, budget_trials=3)
    ex.slowdown[Config.serial(N)] = 10.0  # the warm-up's pace (no policy runs): unlike the training's
    rollouts = [online.collect(16, measure=False) for _ in range(5)]
    assert [r.index for r in rollouts] == list(range(1, 6)) and ex.collects == 5
    assert online.t0 is None and not online.history and online.current is None  # the search has not begun
    del ex.slowdown[Config.serial(N)]
    while online.phase != "locked":
        online.collect(16)
    start = online.history[0]
    assert start.config == Config.serial(N) and max(start.samples) < 1.5 * speeds(Config.serial(N))
    assert online.unmeasured_collects == 5 and online.result().online["unmeasured_collects"] == 5


@pytest.mark.parametrize("num_steps,warmups", [(16, 1), (2048, 0)])
def test_a_trial_after_long_collects_measures_its_first_collect(num_steps, warmups):
    """The first collect of a trial is discarded as a warm-up, unless the collects last
    ``self_warming_seconds`` or more (here 2,048 steps x 8 envs at ~1,000 steps/s: 16 s):
    what a reconfigure (or the run's start) leaves to warm up is then within the noise of one
    collect, and the median of the trial's samples is robust to one slow sample anyway."""
    ex = FakeExecutor(N, speeds, noise=0.0)
    online = grid_online(ex, budget_trials=3, self_warming_seconds=1.0)
    while online.phase != "locked":
        online.collect(num_steps)
    assert len(online.history) == 3
    assert [len(t.warmup) for t in online.history] == [warmups] * 3


def test_no_worker_server_starts_where_no_other_layout_pays_back():
    ex = WarmingFake()
    online = model_online(ex)
    for left in range(5, -1, -1):  # too short a run for any move to pay back
        online.collect(64, remaining_collects=left)
    assert ex.warm_calls == 0 and online.warming_collects == 0


def test_short_collects_are_gathered_into_samples_of_at_least_min_sample_seconds():
    """Off-policy collects of one step per env take milliseconds: a sample spans enough of
    them to measure the layout, not the timer."""
    import math

    ex = FakeExecutor(N, speeds, noise=0.0)
    online = grid_online(ex, budget_trials=2, min_sample_seconds=0.05)
    collects = 0
    while not online.history:
        online.collect(1)  # 8 steps at 1,150 steps/s (the serial start): 7 ms each
        collects += 1
    t = online.history[0]
    per_sample = math.ceil(0.05 / (N / speeds(t.config)))
    assert per_sample >= 7
    assert collects == 1 + t.n * per_sample  # the warm-up collect alone, then whole samples
    assert t.samples == pytest.approx([speeds(t.config)] * t.n)


def test_min_sample_seconds_must_not_be_negative():
    with pytest.raises(ValueError, match="min_sample_seconds"):
        OnlineTuner(FakeExecutor(N, speeds), "grid", cache=False, min_sample_seconds=-1)


def test_the_lock_in_stays_on_the_start_unless_another_is_clearly_faster():
    near = Config(num_actors=2, envs_per_actor=4)
    speed = {Config.serial(N): 1000.0, near: 1020.0}  # 2% faster: within the lock margin

    def truth(c):
        return speed.get(c, 500.0)

    from auturi.tuner import SearchSpace

    space = SearchSpace(totals=SPACE.totals, cores=SPACE.cores, devices=SPACE.devices,
                        configs=[Config.serial(N), near])
    for margin, want in ((0.03, Config.serial(N)), (0.0, near)):
        ex = FakeExecutor(N, truth, noise=0.0)
        online = OnlineTuner(ex, "grid", space=space, cache=False, clock=ex.clock, min_samples=2, max_samples=3,
                             search_share=None, lock_margin=margin)
        while online.phase != "locked":
            online.collect(16)
        assert online.locked_config == want and ex.config == want


def test_a_predicted_gain_below_min_gain_is_not_tried():
    ex = ProfiledFake()
    online = model_online(ex, min_gain=0.99)  # no prediction is 100x the serial figure
    left = 2000
    while online.phase != "locked":
        online.collect(64, remaining_collects=left)
        left -= 1
    assert ex.reconfigures == 0 and online.locked_config == Config.serial(N16)
    assert online.declined and online.declined[0]["benefit_seconds"] == 0.0


def test_a_model_that_overpromises_stops_being_believed():
    """Every layout runs at the serial rate (a cheap env: the profile promises gains the
    machine does not give): each trial delivers none of its promise, the discount falls, and
    the search stops sooner than if the promises were still taken at half."""
    serial_rate = predict(Config.serial(N16), TRUE)

    def search(pinned: bool) -> OnlineTuner:
        ex = ProfiledFake(truth=lambda c: serial_rate)
        online = model_online(ex, lock_margin=0.0)
        if pinned:
            online.discount = lambda: 0.5
        left = 400
        while online.phase != "locked":
            online.collect(64, remaining_collects=left)
            left -= 1
        return online

    learned, pinned = search(False), search(True)
    n = [len([t for t in o.history if t.source == "online"]) for o in (learned, pinned)]
    assert 1 <= n[0] < n[1]
    assert learned.realized and all(r == 0.0 for r in learned.realized)
    assert learned.discount() < 0.5 and learned.declined
    assert learned.result().online["realized"] == learned.realized


def test_with_a_known_horizon_the_search_never_pauses_and_an_unfinished_one_is_cached(tmp_path):
    ex = ProfiledFake()
    online = model_online(ex, cache=tmp_path, search_share=0.001)  # a share any trial exceeds
    phases = []
    for left in range(500, 494, -1):
        online.collect(64, remaining_collects=left)
        phases.append(online.phase)
    assert "paused" not in phases  # each trial paid for itself instead
    assert online.phase == "explore" and not list(tmp_path.iterdir())  # mid-search: nothing cached yet
    online.collect(64, remaining_collects=0)  # a callback stopped learn() early: the last collect
    again = model_online(ProfiledFake(), cache=tmp_path)
    again.collect(64)
    trial = again.current or again.history[0]
    assert again.cached is not None and trial.source == "cache"  # the next run starts from the best so far


def test_short_noisy_collects_do_not_start_re_searches():
    """A locked-in config whose 40 ms collects dip below 80% now and then (a cheap env, a
    busy machine): per collect, three dips in a row start a re-search; summed over
    monitor_seconds, they average out."""
    import itertools

    dips = itertools.cycle([0.7, 0.7, 0.7, 1.3, 1.3, 1.3])  # the mean is the reference
    results = {}
    for seconds in (0.0, 0.5):
        ex = FakeExecutor(N, speeds, noise=0.0)
        online = grid_online(ex, budget_trials=2, drop_fraction=0.2, drop_patience=3, monitor_seconds=seconds)
        while online.phase != "locked":
            online.collect(16)
        locked = online.locked_config
        for _ in range(120):
            ex.slowdown[locked] = 1 / next(dips)
            online.collect(16)
        results[seconds] = online.researches
    assert results[0.0] > 0 and results[0.5] == 0


def test_after_a_confirmed_cached_choice_a_re_search_with_a_known_horizon_only_re_measures(tmp_path):
    """A confirmed cached choice has no model to predict its neighbours: with the run's length
    known, a drop re-measures the locked config and tries no unpredicted neighbour."""
    first = ProfiledFake()
    online = model_online(first, cache=tmp_path)
    run_until(online, first, 300.0)
    choice = online.locked_config
    ex = ProfiledFake()
    again = model_online(ex, cache=tmp_path, monitor_seconds=0)
    left = 500
    while again.phase != "locked":
        again.collect(64, remaining_collects=left)
        left -= 1
    ex.slowdown[choice] = 0.5  # a sustained drop
    for _ in range(12):
        again.collect(64, remaining_collects=left)
        left -= 1
    assert again.researches >= 1
    assert {t.config for t in again.history} == {choice}  # re-measured, nothing else tried



def _actors_faster(c: Config) -> float:
    """The model's own profile's prediction, except that actors stepping their envs in
    process run 40% faster than it says."""
    return predict(c, TRUE) * (1.4 if _in_process_actors(c) else 1.0)


def _in_process_actors(c: Config) -> bool:
    return c.num_actors > 1 and c.env_parallel_degree == 1


class _UnderratesActors(ModelStrategy):
    """A model that ranks every unmeasured layout of actors stepping their envs in process
    30% low (as ours ranked two actors on a CPU-heavy env below an env-worker layout that
    measured 27% slower)."""

    def _refresh(self, measured):
        super()._refresh(measured)
        for c in self._pred:
            if _in_process_actors(c) and c not in measured:
                self._pred[c] *= 0.7
                self._ucb[c] *= 0.7


def run_with_horizon(collects: int) -> OnlineTuner:
    ex = ProfiledFake(truth=_actors_faster)
    online = OnlineTuner(ex, _UnderratesActors(), space=SPACE16, clock=ex.clock, cache=False)
    for left in range(collects - 1, -1, -1):
        online.collect(64, remaining_collects=left)
    return online


def test_on_a_long_run_a_family_the_model_ranks_low_is_tried_and_wins():
    online = run_with_horizon(3000)
    assert _in_process_actors(online.locked_config)


def test_on_a_short_run_no_family_gamble_is_taken():
    online = run_with_horizon(60)
    assert online.phase == "locked" and not any(_in_process_actors(t.config) for t in online.history)
    assert online.declined and online.declined[-1]["cost_seconds"] >= online.declined[-1]["benefit_seconds"]


@pytest.mark.parametrize("n", [3, 5])
def test_the_env_server_starts_ahead_for_an_odd_number_of_envs(n):
    """Degree 2 does not divide 3 or 5 envs: the layout warmed for must be one every count has
    (it raised ConfigError out of the training's collect)."""
    ex = TwoServerFake(warm={"env": 2, "torch": 6})
    ex.num_envs = n
    ex._config = Config.serial(n)
    online = OnlineTuner(ex, "grid", cache=False, clock=ex.clock, search_share=None, min_sample_seconds=0,
                         warm_ahead_seconds=0.0)  # 0: at the first collect not measured
    online.begin(4)
    online.collect(4, measure=False)
    assert set(ex.left) == {"env"}


def test_the_serial_baseline_after_another_start_stops_once_clearly_slower():
    """Started on the user's parallel layout (FAST), serial is measured second; clearly slower
    after one sample, it stops there (it cannot be the choice), and the lock-in is the start."""
    ex = FakeExecutor(N, speeds, noise=0.0, config=FAST)
    online = grid_online(ex, budget_trials=2, min_sample_seconds=0)
    while online.phase != "locked":
        online.collect(16)
    start, serial = online.history[:2]
    assert (start.config, start.source) == (FAST, "start") and start.n >= 2
    assert (serial.config, serial.source, serial.n, serial.stop_reason) == (Config.serial(N), "serial", 1, "slower")
    assert online.locked_config == FAST


def test_a_move_declined_with_no_collect_left_to_gain_on_is_tried_by_a_longer_run():
    """At the end of a short run a move is declined with no benefit left to weigh (no collect
    after its warm-up); its record keeps what each collect would save, so a longer run finds
    it pays back (before, a benefit of 0 scaled to 0 and the short run's choice bound)."""
    from auturi.tuner.online import declined_now_paying

    short = model_online(ProfiledFake())
    for left in range(4, -1, -1):  # the start layout's trial takes all but the last collect
        short.collect(64, remaining_collects=left)
    spent = [d for d in short.declined if d["benefit_seconds"] == 0 and d["cost_seconds"] > 0]
    assert spent, short.declined
    for d in spent:
        assert d["benefit_per_collect"] > 0
        assert declined_now_paying([d], 2000) is d and declined_now_paying([d], 1) is None


def test_the_baselines_cost_is_not_what_a_search_trial_is_priced_at():
    """The serial baseline after another start is measured whatever it costs (here 4x slower
    than the start): its slow collects count in the search's cost, not in what the next move
    is expected to cost (``trial_cost``, per search trial)."""
    start = Config(num_actors=1, envs_per_actor=N16, env_parallel_degree=8)
    ex = ProfiledFake(truth=lambda c: 4000.0 if c == start else 1000.0, config=start)
    online = OnlineTuner(ex, ModelStrategy(profile=TRUE), space=SPACE16, clock=ex.clock, cache=False)
    while len([t for t in online.history if t.source in ("start", "serial")]) < 2:
        online.collect(64, remaining_collects=500)
    assert [t.source for t in online.history][:2] == ["start", "serial"]
    # the serial trial's 3 slow collects (~0.77 s each beyond the start's rate) are the
    # search's cost; of them, the search trials' is at most the next move's reconfigure
    assert online.trial_cost <= ex.reconf_s and online.search_cost - online.trial_cost > 2.0
    for _ in range(40):
        online.collect(64, remaining_collects=400)
    assert 0 < online.trial_cost < online.search_cost


def test_a_reconfigure_that_started_a_server_does_not_price_process_starts():
    """A cached choice applied before the first collect starts its processes' server inside
    that reconfigure (1-2 s of imports): it says nothing of what a started process costs, so
    the estimate keeps its prior until a reconfigure without a server start is measured."""
    from auturi.tuner.online import PROCESS_START_PRIOR, RECONFIGURE_BASE

    online = model_online(ProfiledFake())
    fifteen = Config(num_actors=1, envs_per_actor=N16, env_parallel_degree=16)
    online.reconfigures = [{"seconds": 2.0, "executor": {"started": 3}, "cold": True}]
    assert online._reconfigure_estimate(fifteen, 15) == pytest.approx(RECONFIGURE_BASE + 15 * PROCESS_START_PRIOR)
    online.reconfigures.append({"seconds": 0.06, "executor": {"started": 3}})
    assert online._reconfigure_estimate(fifteen, 15) == pytest.approx(RECONFIGURE_BASE + 15 * 0.02)


def test_a_ctrl_c_between_two_trials_leaves_a_tuner_the_next_collect_goes_on_with(monkeypatch):
    """A KeyboardInterrupt while the tuner moves from one trial to the next (a SIGINT during
    its bookkeeping) left it searching with no trial: the next collect (the user's next
    learn()) failed with a bare AssertionError. It now starts the next trial there."""
    from auturi.tuner import online as online_module

    ex = FakeExecutor(N, speeds, noise=0.01)
    online = grid_online(ex, budget_trials=4)
    real, fired = online_module.OnlineTuner._advance, []

    def advance(self):
        if not fired:
            fired.append(1)
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(online_module.OnlineTuner, "_advance", advance)
    with pytest.raises(KeyboardInterrupt):
        for _ in range(10):
            online.collect(16)
    assert online.phase == "explore" and online.current is None  # between two trials
    for _ in range(40):
        online.collect(16)
    assert online.phase == "locked" and online.locked_config == FAST
    assert len(online.history) == 4


def test_a_layout_whose_workers_fail_names_the_move_and_how_to_train_without_it():
    """An env that cannot be made outside the training process fails the tuner's move to env
    workers; the executor is gone then. The error says which move it was and how to train
    anyway (a fixed layout that ran, or no tuning), and keeps the worker's fields."""
    from auturi import WorkerError

    class Failing(FakeExecutor):
        def reconfigure(self, config):
            if config.env_parallel_degree > 1 or config.num_actors > 1:
                self.closed = True
                raise WorkerError("env worker 1 of actor 0 (envs 4-7)", "raised an exception", "Traceback: ...",
                                  config)
            return super().reconfigure(config)

    ex = Failing(N, speeds, noise=0.01)
    online = grid_online(ex, budget_trials=4)
    with pytest.raises(WorkerError) as info:
        for _ in range(10):
            online.collect(16)
    e = info.value
    assert e.worker == "env worker 1 of actor 0 (envs 4-7)" and e.traceback == "Traceback: ..."
    assert f"moving from {Config.serial(N)} to {FAST}" in e.reason
    assert f"auturi.wrap(..., config=auturi.{Config.serial(N)!r})" in e.reason and "tune=False" in e.reason
