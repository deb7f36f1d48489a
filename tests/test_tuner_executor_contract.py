"""The executor contract's tuner half (auturi.executor.contract) as the backends answer it,
the online tuner's settings declared once (OnlineSettings) as every face takes them, and the
policy device checked in one place (auturi.resources.check_device)."""
from __future__ import annotations

import gymnasium as gym
import pytest

import auturi
from auturi import Config, ConfigError
from auturi.envs import CountingEnv
from auturi.executor.contract import ExecutorLike, MoveCost, as_executor_like, planned_move_cost
from auturi.tuner import OnlineTuner
from auturi.tuner.online_settings import OnlineSettings
from tests.helpers import FakeExecutor

N = 4
DEGREE = Config(envs_per_actor=N, env_parallel_degree=N)
BATCH = Config(envs_per_actor=N, env_parallel_degree=N, policy_batch_size=2)


def _executor(backend: str, config: Config | None = None):
    return auturi.make_executor(CountingEnv, auturi.RandomPolicy(gym.spaces.Discrete(3)), N, config,
                                backend=backend)


# ---------------------------------------------------------------------------- the contract
def test_the_serial_backend_answers_the_tuner_half_with_nothing_to_start_ahead():
    with _executor("serial") as ex:
        assert isinstance(ex, ExecutorLike) and as_executor_like(ex) is ex
        assert ex.move_cost(ex.config) == MoveCost() and MoveCost().free
        cost = ex.move_cost(DEGREE)
        assert cost.cold_servers == 0 and cost.devices == 0
        ex.prepare(DEGREE)
        assert not ex.warming and ex.config == Config.serial(N)  # prepare never moves the layout
    with pytest.raises(auturi.AuturiError, match="closed"):
        ex.prepare(DEGREE)


def test_the_shm_backend_starts_the_processes_its_move_cost_says():
    """What ``move_cost`` predicts from the plans' diff is what the reconfigure then reports."""
    with _executor("shm") as ex:
        ex.collect(2)
        for config in (DEGREE, BATCH, Config(num_actors=2, envs_per_actor=2), Config.serial(N)):
            old = ex.config
            predicted, back = ex.move_cost(config), ex.move_cost(old, origin=config)
            ex.reconfigure(config)
            assert ex.last_reconfigure["started"] == predicted.processes, config
            assert ex.move_cost(config) == MoveCost()  # there now
            assert ex.move_cost(old) == back  # the way back, from here, as priced from anywhere
            ex.collect(2)
        assert planned_move_cost(DEGREE, BATCH).processes == 0  # a batch change keeps the env workers


def test_the_shm_backend_says_which_servers_a_move_waits_for_and_prepare_starts_them():
    """ShmExecutor answers the tuner half's hooks (``_cold_servers``, ``_warm_for``: its
    ``needs_warm_start`` and ``warm_start``)."""
    import os

    if os.environ.get("AUTURI_START_METHOD", "forkserver") != "forkserver":
        pytest.skip("requires the forkserver start method (servers exist under it only)")
    with _executor("shm") as ex:
        cost = ex.move_cost(DEGREE)
        assert cost.processes == N - 1 and cost.cold_servers == 1  # the env workers' server
        ex.prepare(DEGREE)
        assert ex.wait_warm(timeout=120)
        assert not ex.warming and ex.move_cost(DEGREE).cold_servers == 0
        ex.reconfigure(DEGREE)
        assert ex.last_reconfigure["started"] == N - 1


def test_an_executor_of_ones_own_gets_the_contracts_defaults():
    ex = FakeExecutor(8, lambda c: 1000.0)
    view = as_executor_like(ex)
    assert isinstance(view, ExecutorLike) and not isinstance(ex, ExecutorLike)
    assert view.warming is False and view.last_reconfigure is None
    view.prepare(Config(num_actors=2, envs_per_actor=4))  # nothing to do, and no error
    assert view.move_cost(Config(num_actors=2, envs_per_actor=4)) == MoveCost(processes=2)
    assert view.config == ex.config and view.backend == "fake"  # the rest is the executor's own
    ex.move_cost = lambda config, origin=None: MoveCost(processes=7)  # what it answers itself wins
    assert view.move_cost(Config.serial(8)).processes == 7
    with pytest.raises(TypeError, match="lacks collect, reconfigure"):
        as_executor_like(type("NotAnExecutor", (), {"config": Config.serial(2), "num_envs": 2})())


def test_a_move_to_a_gpu_counts_the_devices_it_initialises():
    gpu = Config(envs_per_actor=N, policies_per_actor=2, policy_device="cuda", policy_batch_size=2)
    assert planned_move_cost(Config.serial(N), gpu) == MoveCost(processes=2, devices=2)
    assert planned_move_cost(Config.serial(N), Config.serial(N, "cuda")) == MoveCost(devices=1)  # the caller's own
    assert planned_move_cost(gpu, Config.serial(N)).devices == 0


# ---------------------------------------------------------------------------- the settings
def test_online_settings_name_the_field_and_the_rule():
    s = OnlineSettings()
    assert s.budget_trials == 6 and s.drop_patience == 3 and s.protocol().max_seconds is None
    for bad, field in (({"min_gain": 1.0}, "min_gain"), ({"drop_patience": 0}, "drop_patience"),
                       ({"max_samples": 1}, "max_samples"), ({"search_share": 0}, "search_share"),
                       ({"budget_trials": True}, "budget_trials"), ({"monitor_seconds": float("nan")}, "monitor")):
        with pytest.raises(ValueError, match=f"OnlineSettings.{field}"):
            OnlineSettings(**bad)
    with pytest.raises(TypeError, match="did you mean 'lock_margin'"):
        OnlineSettings(lock_margn=0.1)
    changed = s.replace(search_share=None)
    assert changed.search_share is None and s.search_share == 0.05  # frozen: a copy
    with pytest.raises(AttributeError):
        s.min_gain = 0.5  # type: ignore[misc]


def test_the_tuner_takes_the_settings_or_the_same_names_as_keywords():
    ex = FakeExecutor(8, lambda c: 1000.0)
    a = OnlineTuner(ex, "grid", OnlineSettings(drop_patience=5, budget_trials=2), cache=False)
    b = OnlineTuner(ex, "grid", cache=False, drop_patience=5, budget_trials=2)
    assert a.settings == b.settings and a.budget_trials == 2
    c = OnlineTuner(ex, "grid", OnlineSettings(drop_patience=5), cache=False, drop_patience=7)
    assert c.settings.drop_patience == 7  # a keyword overrides the settings object
    with pytest.raises(TypeError, match="did you mean 'drop_patience'"):
        OnlineTuner(ex, "grid", cache=False, drop_patiense=5)


def test_every_face_takes_the_settings_or_a_checked_dict():
    from auturi.adapters.common import resolve_budget, tuner_kwargs

    settings = OnlineSettings(search_share=0.1, budget_trials=3)
    out = resolve_budget(tuner_options=settings, budget_seconds=20)
    assert OnlineTuner(FakeExecutor(8, lambda c: 1.0), "grid", cache=False, **out).settings == \
        settings.replace(budget_seconds=20.0)
    assert tuner_kwargs(settings) == settings.to_dict()
    assert resolve_budget(tuner_options={"search_share": 0.1, "cache": False}) == {"search_share": 0.1, "cache": False}
    with pytest.raises(TypeError, match="did you mean 'search_share'"):
        resolve_budget(tuner_options={"serch_share": 0.1})
    with pytest.raises(ValueError, match="OnlineSettings.drop_fraction"):
        resolve_budget(tuner_options={"drop_fraction": 2.0})


# ---------------------------------------------------------------------------- the device
def test_the_device_is_checked_once_for_the_executor_the_space_the_cli_and_ray(monkeypatch):
    from auturi import resources
    from auturi.cli.common import CliError
    from auturi.cli.knobs import parse_devices
    from auturi.tuner import space as space_mod

    monkeypatch.setattr(resources, "cuda_device_count", lambda: 0)
    monkeypatch.setattr(space_mod, "_cuda_device_count", lambda: 0)
    with pytest.raises(ConfigError, match="no CUDA device here") as e:
        resources.check_device("cuda")
    rule = e.value.rule
    with _executor("serial") as ex, pytest.raises(ConfigError) as from_ex:
        ex.reconfigure(Config.serial(N, "cuda"))
    assert from_ex.value.rule == rule
    space = auturi.build_space(N, cores=2, devices=["cpu", "cuda"])
    assert {why for c, why in space.pruned if c.policy_device == "cuda"} == {f"cuda unavailable: {rule}"}
    with pytest.raises(CliError, match="no CUDA device here"):
        parse_devices("cpu,cuda")
    assert resources.ClusterResources((4,), (0,)).knob_problem(Config.serial(2, "cuda")) == \
        ("policy_device", "no GPU in the Ray cluster; use policy_device='cpu', or add a node with a GPU")
    assert resources.check_device("cuda:1", cuda_count=2) == "cuda:1"
    with pytest.raises(ConfigError, match="'cpu', 'cuda' or 'cuda:k'"):
        resources.check_device("gpu")
