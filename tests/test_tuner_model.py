"""The model's per-collect costs (issue 16): off-policy training collects ``train_freq``
steps per env, often 1, so what a collect costs whatever its length (waking actors, env
workers, replicas) decides the layout. Synthetic profiles; one tiny serial executor."""
from __future__ import annotations

import gymnasium as gym
import pytest

import auturi
from auturi import Config
from auturi.envs import CountingEnv
from auturi.rollout import CollectStats
from auturi.tuner.profile import Profile, collect_overhead, fit_overheads, predict, profile_executor
from auturi.tuner.rollout_profile import profile_from_stats
from auturi.tuner.space import build_space
from tests.helpers import FakeExecutor
from auturi.tuner.strategies import ModelStrategy

POLICY = {"cpu": {b: 50e-6 + 3e-6 * b for b in (1, 2, 4, 8)}}


def _in_process(c: Config) -> bool:
    return c.num_actors == 1 and c.env_parallel_degree == 1 and c.policies_per_actor == 1


def _ranked(space, prof: Profile) -> list[Config]:
    return sorted(space.configs, key=lambda c: -predict(c, prof))


def _model_best(space, prof: Profile) -> Config:
    strat = ModelStrategy(profile=prof)
    strat.prepare(space, num_steps=prof.num_steps)
    return strat.propose([])


def test_one_step_collects_favour_the_in_process_layout_and_long_ones_keep_their_ranking():
    """A cheap env (20 us a step, like CartPole; 8 envs, 2 cores): two actors win by ~1.6x
    per step, but with off-policy's 1-step collects the actors' and workers' wake-ups cost
    more than they save, so the model picks an in-process layout; for 64-step collects the
    per-collect costs are spread thin and the ranking is the per-step one's."""
    space = build_space(8, cores=2, devices=["cpu"])
    per_step = Profile(env_step_seconds=20e-6, policy_seconds=POLICY, cores=2)  # num_steps unknown: per step
    one, long = per_step.replace(num_steps=1), per_step.replace(num_steps=64)
    assert not _in_process(_model_best(space, per_step))
    assert _in_process(_model_best(space, one)), _model_best(space, one)
    assert predict(Config.serial(8), one) > 1.2 * max(predict(c, one) for c in space.configs if c.num_actors > 1)
    assert _model_best(space, long) == _model_best(space, per_step)
    assert _ranked(space, long)[:2] == _ranked(space, per_step)[:2]  # 3rd and 4th are within 1% per step
    # Every pair of configs more than 2% apart per step keeps its order (a few closer pairs
    # swap: four actors pay four wake-ups per collect).
    a, b = [predict(c, per_step) for c in space.configs], [predict(c, long) for c in space.configs]
    apart = [(i, j) for i in range(len(a)) for j in range(i) if abs(a[i] / a[j] - 1) > 0.02]
    assert len(apart) > 1000 and all((a[i] > a[j]) == (b[i] > b[j]) for i, j in apart)


def test_one_step_collects_of_a_slower_env_still_go_parallel():
    """Where a row of env steps outweighs the wake-ups (100 us a step), 1-step collects keep
    a parallel layout: the fixed costs decide only where they are the larger part."""
    space = build_space(8, cores=2, devices=["cpu"])
    one = Profile(env_step_seconds=100e-6, policy_seconds=POLICY, cores=2, num_steps=1)
    assert not _in_process(_model_best(space, one))
    assert predict(_model_best(space, one), one) > 1.2 * predict(Config.serial(8), one)


def test_each_family_pays_its_own_per_collect_cost():
    prof = Profile(env_step_seconds=1e-4, collect_seconds=1.0, actor_collect_seconds=10.0,
                   env_worker_collect_seconds=100.0, replica_collect_seconds=1000.0)
    assert collect_overhead(Config.serial(4), prof) == 1.0
    assert collect_overhead(Config(num_actors=2, envs_per_actor=2), prof) == 21.0  # each actor is woken
    assert collect_overhead(Config(envs_per_actor=4, env_parallel_degree=2), prof) == 101.0
    assert collect_overhead(Config(envs_per_actor=4, policies_per_actor=2, policy_batch_size=2), prof) == 1001.0
    assert collect_overhead(Config(num_actors=2, envs_per_actor=2), prof.replace(backend="serial")) == 1.0
    # On ray even one actor is a Ray actor: a remote call per collect.
    assert collect_overhead(Config.serial(4), prof.replace(backend="ray")) == 11.0


def test_fit_overheads_refits_the_per_collect_costs_from_measured_trials():
    """Measured 1-step collects where waking workers costs ~7 ms (as in a smoke run under
    load) against priors of ~0.1 ms: the prior model picks a parallel layout, the refit one
    the in-process layout the measurements favour, and it predicts them closely."""
    space = build_space(8, cores=2, devices=["cpu"])
    prior = Profile(env_step_seconds=400e-6, policy_seconds=POLICY, cores=2, num_steps=1)
    truth = prior.replace(collect_seconds=0.8e-3, actor_collect_seconds=7e-3, env_worker_collect_seconds=6e-3,
                          replica_collect_seconds=7e-3)
    assert not _in_process(_model_best(space, prior)) and _in_process(_model_best(space, truth))
    trials = [Config.serial(8), Config(num_actors=2, envs_per_actor=4), Config(envs_per_actor=8, env_parallel_degree=2),
              Config(envs_per_actor=8, policies_per_actor=2, policy_batch_size=4),
              Config(num_actors=4, envs_per_actor=2, env_parallel_degree=2)]
    measured = [(c, predict(c, truth)) for c in trials]
    fitted = fit_overheads(prior, measured)
    assert _in_process(_model_best(space, fitted))
    for c, v in measured:
        assert predict(c, fitted) == pytest.approx(v, rel=0.15)
    assert fitted.actor_collect_seconds > 10 * prior.actor_collect_seconds


def test_without_a_collect_length_the_model_prices_steps_only_as_before():
    prof = Profile(env_step_seconds=1e-4, policy_seconds=POLICY, cores=2, collect_seconds=1.0,
                   actor_collect_seconds=1.0)
    for c in (Config.serial(8), Config(num_actors=2, envs_per_actor=4)):
        assert predict(c, prof) == pytest.approx(predict(c, prof.replace(collect_seconds=0.0,
                                                                          actor_collect_seconds=0.0)))


def test_profiles_know_the_collect_length():
    """Online, from the training's own collects; offline, the length the tuner measured the
    start config at (the executor's last collect), or the one given."""
    st = CollectStats(steps=8, seconds=0.01, env_seconds=0.004, policy_seconds=0.002)
    assert profile_from_stats([st], Config.serial(8), num_steps=1).num_steps == 1
    with auturi.make_executor(CountingEnv, auturi.RandomPolicy(gym.spaces.Discrete(3)), 2, backend="serial") as ex:
        fast = {"env_seconds": 0.0, "policy_seconds": 0.0, "batch_sizes": [2]}
        assert profile_executor(ex, **fast).num_steps == 0  # nothing collected yet: unknown
        ex.collect(3)
        assert profile_executor(ex, **fast).num_steps == 3
        assert profile_executor(ex, num_steps=1, **fast).num_steps == 1


def _waiting_truth(c: Config) -> float:
    """A 1 ms env that waits (16 envs, 2 cores): the more env processes the faster."""
    return 800.0 * min(16, c.num_actors * c.env_parallel_degree) ** 0.9


@pytest.mark.parametrize("cpu_fraction, widened", [(0.04, True), (1.0, False)])
def test_the_search_widens_to_a_process_per_env_when_the_env_waits(cpu_fraction, widened):
    """The tuner builds its space before it knows the env; once the profile says the env
    mostly waits, the process cap counts env processes by their CPU share, so the model can
    propose (and here choose) an env process per env. A computing env keeps the plain space."""
    prof = Profile(env_step_seconds=1e-3, env_cpu_fraction=cpu_fraction, policy_seconds=POLICY, cores=2)
    ex = FakeExecutor(16, _waiting_truth)
    tuner = auturi.Tuner("model", budget_trials=8, cores=2, devices=["cpu"], cache=False, clock=ex.clock,
                         strategy_kwargs={"profile": prof}, workload={"name": "waits"})
    result = tuner.tune(ex, 16)
    one_per_env = Config(num_actors=1, envs_per_actor=16, env_parallel_degree=16)
    assert (one_per_env in tuner.space) is widened
    assert (len(tuner.space) > len(build_space(16, cores=2, devices=["cpu"]))) is widened
    if widened:
        assert result.choice.num_actors * result.choice.env_parallel_degree == 16, result.choice


def test_tune_plans_for_the_cores_it_is_given():
    """``cores=`` sets the space's process cap and the model's cores (to leave cores to a
    learner, or to plan for an emulated machine); a count below one names the fix."""
    r = auturi.tune("CartPole-v1", policy="mlp", num_envs=4, num_steps=4, budget_trials=1, backend="serial",
                    cache=False, cores=1, max_trial_seconds=0.2)
    assert r.space["cores"] == 1 and r.space["pruned_by_reason"].get("more processes than 4x cores", 0) > 0
    wide = auturi.tune("CartPole-v1", policy="mlp", num_envs=4, num_steps=4, budget_trials=1, backend="serial",
                       cache=False, cores=8, max_trial_seconds=0.2)
    assert wide.space["cores"] == 8 and wide.space["configs"] > r.space["configs"]
    with pytest.raises(ValueError, match="cores must be an integer >= 1"):
        auturi.tune("CartPole-v1", num_envs=4, backend="serial", cache=False, cores=0)
