"""``auturi.tune(env, ...)`` (issue 18, items 6 and 10): the CLI's job from Python, its result
ready for ``wrap``, each finalist's time split and the machine's limit; the CLI's record and
progress line carry them."""
from __future__ import annotations

import math
from types import SimpleNamespace

import gymnasium as gym
import pytest

import auturi
from auturi import CollectStats
from auturi.envs import CountingEnv
from auturi.tuner.api import TuneReport, machine_limit, time_split


@pytest.fixture(scope="module")
def report():
    return auturi.tune(CountingEnv, policy=auturi.RandomPolicy(gym.spaces.Discrete(3)), num_envs=4, num_steps=8,
                       budget_trials=3, backend="shm", cache=False, max_trial_seconds=0.5)


def test_tune_returns_a_config_for_wrap_and_explains_it(report):
    assert isinstance(report, auturi.TuneResult) and report.config == report.choice
    assert report.config.num_envs == 4
    assert report.splits, "no finalist's split"
    for s in report.splits:
        assert set(s["split"]) == {"env", "inference", "waiting", "ipc"}
        assert math.isclose(sum(s["split"].values()), 1.0, abs_tol=1e-3), s
    assert report.split(report.config) is not None
    assert report.limit["cores"] >= 1 and report.limit["steps_per_second"] > 0
    share = report.limit_share()
    assert share is not None and share == pytest.approx(report.throughput / report.limit["steps_per_second"])


def test_the_record_round_trips_the_explanation(report, tmp_path):
    path = report.save(tmp_path / "r.json")
    back = TuneReport.load(path)
    assert back.splits == report.splits and back.limit == report.limit and back.config == report.config
    assert back.to_record()["explain"]["limit_share"] == pytest.approx(report.limit_share())


def test_the_policy_may_be_named():
    r = auturi.tune("CartPole-v1", policy="mlp", num_envs=2, num_steps=4, budget_trials=1, backend="serial",
                    cache=False, max_trial_seconds=0.2)
    assert r.workload["policy"]["class"].endswith("TorchPolicy")


@pytest.mark.parametrize("kwargs, match", [
    ({"budget_seconds": -1}, "budget_seconds must be a number of seconds > 0"),
    ({"budget_trials": 1.5}, "budget_trials must be an integer >= 1"),
    ({"num_envs": 0}, "num_envs must be an integer >= 1"),
    ({"backend": "mpi"}, "unknown backend 'mpi'"),
    ({"policy": "transformer"}, "policy='transformer': use mlp, cnn, auto or a Policy object"),
])
def test_bad_arguments_name_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace("[", r"\[")):
        auturi.tune("CartPole-v1", **{"backend": "serial", **kwargs})


def test_time_split_counts_every_actor_and_the_rest_as_ipc():
    two_actors = [CollectStats(steps=8, seconds=1.0, env_seconds=1.0, policy_seconds=0.5, wait_seconds=0.1)]
    split = time_split(two_actors, num_actors=2)  # 2 s of actor time, 1.6 s of it accounted for
    assert split == {"env": 0.5, "inference": 0.25, "waiting": 0.05, "ipc": 0.2}


def test_machine_limit_is_capped_by_the_best_batched_inference():
    serial = [CollectStats(steps=100, seconds=0.2, env_seconds=0.01, policy_seconds=0.1)]
    lim = machine_limit(serial, cores=4, profile={"policy_seconds": {"cpu": {"1": 0.001, "8": 0.002}}})
    assert lim["env_steps_per_second"] == 40_000.0  # 4 cores x 10,000 steps/s of one env
    assert lim["inference_steps_per_second"] == 4_000.0  # batch 8 in 2 ms beats the serial 1,000
    assert lim["steps_per_second"] == 4_000.0 and lim["bound"] == "inference"


def test_machine_limit_shares_the_cores_between_envs_and_inference():
    """Without a GPU, inference runs on the cores the envs step on: 100 us of env and 50 us
    of inference CPU per step (the cheapest row of the profile's CPU table) on 2 cores is
    2 / 150 us, not 2 / 100 us."""
    serial = [CollectStats(steps=100, seconds=0.02, env_seconds=0.01, policy_seconds=0.008)]
    prof = {"policy_seconds": {"cpu": {"1": 80e-6, "8": 100e-6}}, "policy_cpu_seconds": {"cpu": {"1": 90e-6, "8": 400e-6}}}
    lim = machine_limit(serial, cores=2, profile=prof, num_envs=8)
    assert lim["env_steps_per_second"] == 20_000.0  # the envs alone
    assert lim["cpu_steps_per_second"] == pytest.approx(2 / 150e-6, rel=1e-4)
    assert lim["steps_per_second"] == lim["cpu_steps_per_second"] and lim["bound"] == "env"


def test_machine_limit_of_an_env_that_waits_is_every_env_at_once():
    """A 1 ms env that computes 5% of it: the cores are not its ceiling (40,000 steps/s of
    its CPU on 2 cores), 16 envs stepping at once are (16,000 steps/s); counted as computing
    it would have been 2,000 steps/s, a ceiling the tuner's choice passes 5-fold."""
    serial = [CollectStats(steps=1000, seconds=1.05, env_seconds=1.0, policy_seconds=0.01)]
    lim = machine_limit(serial, cores=2, profile={"env_cpu_fraction": 0.05}, num_envs=16)
    assert lim["concurrent_steps_per_second"] == 16_000.0 and lim["steps_per_second"] == 16_000.0
    assert lim["bound"] == "env" and lim["cpu_steps_per_second"] > 16_000.0
    assert machine_limit(serial, cores=2, num_envs=16)["steps_per_second"] < 2_000.0  # without the profile's share


def test_machine_limit_counts_no_core_for_cuda_inference():
    """The GPU box of 2026-11-26 (16 cores, Pong 64 envs; ``../shared/data/gpu-2026-11-26/``):
    the serial collects step an env in 0.553 ms; the profile's CPU inference costs 0.65 ms of
    CPU a step at best, a CUDA pass 11 us of host CPU a step (batch 64). The old limit charged
    the cores the CPU's inference (14,035 steps/s; the CUDA choice's 14,226 was "101%"); the
    limit now takes the best device, CUDA, whose passes take the cores only their host side."""
    steps = 64 * 64
    serial = [CollectStats(steps=steps, seconds=steps / 1_931, env_seconds=steps * 16 / 28_943,
                           policy_seconds=steps * 0.1e-3)]
    prof = {"env_cpu_fraction": 1.0,
            "policy_seconds": {"cpu": {"32": 1.23e-3, "64": 2.45e-3}, "cuda": {"32": 0.60e-3, "64": 0.70e-3}},
            "policy_cpu_seconds": {"cpu": {"32": 18.8e-3, "64": 41.6e-3}, "cuda": {"32": 0.60e-3, "64": 0.72e-3}}}
    lim = machine_limit(serial, cores=16, profile=prof, num_envs=64)
    assert lim["inference_device"] == "cuda"
    assert lim["inference_cpu_seconds"] == pytest.approx(0.72e-3 / 64)
    assert lim["env_steps_per_second"] == pytest.approx(28_943, rel=1e-3)
    assert lim["steps_per_second"] == pytest.approx(16 / (16 / 28_943 + 0.72e-3 / 64), rel=1e-3)  # 28,369
    assert 14_226 / lim["steps_per_second"] == pytest.approx(0.50, abs=0.01)  # the choice: 50%, not 101%
    # The same machine without CUDA inference: the cores carry the CPU's forward passes.
    no_gpu = {k: {"cpu": v["cpu"]} for k, v in prof.items() if isinstance(v, dict)}
    cpu_lim = machine_limit(serial, cores=16, profile={**no_gpu, "env_cpu_fraction": 1.0}, num_envs=64)
    assert cpu_lim["inference_device"] == "cpu" and cpu_lim["steps_per_second"] < 0.55 * lim["steps_per_second"]
    # The record's measurements fit a 1.8x slower env step with every core busy: the envs
    # alone at that speed, beside the perfect-scaling figure (which stays as it was).
    assert lim["loaded_env_steps_per_second"] is None
    loaded = machine_limit(serial, cores=16, profile=prof, num_envs=64, loaded_step_factor=1.8)
    assert loaded["loaded_env_steps_per_second"] == pytest.approx(28_943 / 1.8, rel=1e-3)
    assert loaded["steps_per_second"] == lim["steps_per_second"]


def test_progress_says_trial_n_of_at_most_m_and_time_left():
    from auturi.cli.render import progress_fields

    status = {"phase": "search", "trials": 4, "budget_trials": None, "space": {"configs": 9},
              "budget_seconds": 15.0, "budget_seconds_left": 7.2, "current_config": None, "best_throughput": 1e3}
    fields = progress_fields(SimpleNamespace(status=status))
    assert fields["description"].startswith("search    trial 5 of at most 9, 7 s left")
    assert fields["completed"] == int(1000 * (1 - 7.2 / 15.0))


def test_a_tune_over_a_gpu_measures_its_baselines_with_the_policy_on_the_gpu():
    """``devices`` naming a GPU: the start is serial with the policy there (the loop a GPU user
    runs) and so is the serial baseline, as the online tuner's. On the H200 box the offline
    tuner measured serial with CPU inference (758 steps/s on Pong): most of its 45 s budget,
    2 configs measured. The limit reads the serial collects' passes as the GPU's."""
    from auturi.testing.emulated_gpu import emulated_box

    with emulated_box("pong-like", time_scale=0.02, context_seconds=0.0) as box:
        result = auturi.tune(box.env, policy=box.policy(), num_envs=4, num_steps=4, budget_trials=2,
                             devices=["cpu", "cuda"], backend="serial", cache=False)
    assert result.start == auturi.Config.serial(4, "cuda")
    baselines = [t for t in result.trials if t.source in ("start", "serial")]
    assert [t.config for t in baselines] == [auturi.Config.serial(4, "cuda")]  # serial is the start: measured once
    assert not any(t.config == auturi.Config.serial(4) and t.source == "serial" for t in result.trials)
    assert result.limit["steps_per_second"] is not None
    with emulated_box("pong-like", time_scale=0.02, context_seconds=0.0) as box:  # devices left to the machine
        result = auturi.tune(box.env, policy=box.policy(), num_envs=4, num_steps=4, budget_trials=1,
                             backend="serial", cache=False)
    assert result.start == auturi.Config.serial(4, "cuda")
    plain = auturi.tune(CountingEnv, policy=auturi.RandomPolicy(gym.spaces.Discrete(3)), num_envs=2, num_steps=4,
                           budget_trials=1, backend="serial", cache=False)
    from auturi.tuner.space import available_devices

    here = "cuda" if "cuda" in available_devices() else "cpu"  # no GPU (CI): the CPU, as before
    assert plain.start == auturi.Config.serial(2, here)
