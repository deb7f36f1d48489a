"""``auturi.tune``'s checks of what it is given, before anything starts."""
from __future__ import annotations

import gymnasium as gym
import pytest

import auturi


def _cartpole():
    return gym.make("CartPole-v1")


def test_a_list_of_factories_that_does_not_match_num_envs_names_both_counts():
    with pytest.raises(ValueError, match="num_envs=2 but 3 env factories were given"):
        auturi.tune([_cartpole] * 3, num_envs=2, budget_seconds=1)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"seed": -1}, ValueError, "seed must be an integer >= 0, got -1"),
    ({"num_envs": True}, ValueError, "num_envs must be an integer >= 1, got True"),
    ({"budget_seconds": True}, ValueError, "budget_seconds must be a number of seconds > 0, got True"),
    ({"max_trial_seconds": "4"}, ValueError, "max_trial_seconds must be a number of seconds > 0, got '4'"),
    ({"budget_trials": 0}, ValueError, r"budget_trials must be an integer >= 1, got 0 \(None: the strategy's own stop\)"),
    ({"devices": "cpu"}, TypeError, r"devices must be a list of devices.*write \['cpu'\]"),
    ({"devices": []}, ValueError, r"devices is empty.*pass \['cpu'\]"),
    ({"devices": ["cuda:7"]}, auturi.ConfigError, "cuda:7 does not exist here: 1 CUDA device"),
    ({"foo": 1}, TypeError, r"unexpected keyword argument\(s\) 'foo'.*worker_timeout"),
    ({"backend": "serial", "address": "auto"}, TypeError, r"'address'.*make_executor\(backend='serial'\)"),
])
def test_bad_arguments_are_named_before_anything_starts(kwargs, error, match, monkeypatch):
    """Each bad argument is refused with its name and the fix, before the backend's worker
    processes start (a seed of -1 failed in gymnasium after the executor had started; an
    unknown keyword in the executor's constructor after the forkservers had; a str of devices
    on its first letter; a missing GPU searched nothing)."""
    import auturi.executor

    monkeypatch.setattr(auturi.executor, "warm_backend", lambda *a, **k: pytest.fail("started the backend"))
    monkeypatch.setattr("auturi.resources.cuda_device_count", lambda: 1)  # cuda:7 is missing on any machine
    with pytest.raises(error, match=match):
        auturi.tune(_cartpole, **{"num_envs": 2, "budget_trials": 1, **kwargs})


def test_numpy_integers_count_as_whole_numbers():
    """``num_envs=np.int64(2)`` (a count from numpy arithmetic) was refused as not an integer."""
    import numpy as np

    r = auturi.tune("CartPole-v1", policy="mlp", num_envs=np.int64(2), num_steps=np.int32(4), budget_trials=1,
                    backend="serial", cache=False, seed=np.int64(3), max_trial_seconds=0.2)
    assert r.config == auturi.Config.serial(2)


def test_the_executor_keyword_table_matches_the_constructors():
    """``EXECUTOR_KEYWORDS`` (what ``auturi.tune`` lets through to ``make_executor``) lists
    exactly the keywords the backends' constructors take."""
    import inspect

    from auturi.executor import EXECUTOR_KEYWORDS
    from auturi.executor.base import Executor
    from auturi.executor.shm import ShmExecutor

    def own(cls) -> set[str]:
        return {n for n, p in inspect.signature(cls.__init__).parameters.items()
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)} - {"self"}

    assert EXECUTOR_KEYWORDS["all"] == own(Executor) - {"env", "policy", "num_envs", "config", "seed"}
    assert EXECUTOR_KEYWORDS["shm"] == own(ShmExecutor)
    ray_executor = pytest.importorskip("auturi.executor.ray.executor")
    assert EXECUTOR_KEYWORDS["ray"] == own(ray_executor.RayExecutor)


def test_a_raw_atari_id_names_the_factory_of_the_frames_agents_train_on():
    """From Python an Atari id stays raw (210x160x3); the CLI tunes the preprocessed frames. A
    built-in policy that cannot take the raw frames, or an MLP chosen over them, says which
    factory gives the CLI's workload."""
    pytest.importorskip("ale_py")
    from auturi.tuner.api import _builtin_for

    with pytest.raises(ValueError, match=r"policy='cnn' needs.*AtariPreprocessed\('ALE/Pong-v5'\).*policy='mlp'"):
        auturi.tune("ALE/Pong-v5", policy="cnn", budget_seconds=1)
    with pytest.warns(UserWarning, match=r"MLP here.*raw \(210, 160, 3\).*AtariPreprocessed\('ALE/Pong-v5'\)"):
        _builtin_for("ALE/Pong-v5", "auto")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not an Atari id: no warning
        _builtin_for("CartPole-v1", "auto")


def test_an_env_that_fails_in_the_serial_layout_is_named_as_the_envs_fault():
    """The layout-skipping advice (a space without such layouts, --backend serial) does not
    apply when the serial layout itself failed: the env fails whatever the layout."""
    import functools

    from auturi.envs.testing import FaultyEnv
    from auturi.tuner.result import TuneError

    with pytest.raises(TuneError, match=r"That is the serial layout.*the env itself fails") as info:
        auturi.tune(functools.partial(FaultyEnv, fail_step=5), policy=auturi.RandomPolicy(gym.spaces.Discrete(3)),
                    num_envs=2, num_steps=8, budget_trials=2, backend="serial", cache=False)
    assert info.value.env_fails and "build_space" not in str(info.value)
