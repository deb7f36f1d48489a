"""What both faces share: the budget argument, the backends they accept, and the stuck-worker
bound reaching the executor a face builds."""
from __future__ import annotations

import functools
import os

import pytest

from auturi.adapters.common import check_face_options, tuner_kwargs
from tests.helpers import BlockingEnv

pytest.importorskip("stable_baselines3")


def test_budget_forms():
    assert tuner_kwargs(None) == {}
    assert tuner_kwargs({"search_share": 0.2}) == {"search_share": 0.2}
    with pytest.raises(TypeError, match="budget must be"):
        tuner_kwargs(True)
    with pytest.raises(TypeError, match="budget must be"):
        tuner_kwargs("fast")


def test_faces_take_ray_and_refuse_bad_options_with_the_fix():
    check_face_options("shm", None)
    check_face_options("serial", 5)
    check_face_options("ray", None)
    with pytest.raises(ValueError, match="needs backend='ray'"):
        check_face_options("shm", None, address="auto")
    with pytest.raises(ValueError, match="backend must be one of"):
        check_face_options("threads", None)
    for bad in (0, -1.0, "soon"):
        with pytest.raises(ValueError, match="worker_timeout must be"):
            check_face_options("shm", bad)


def test_sb3_wrap_surfaces_a_stuck_env_as_worker_error(tmp_path):
    """The one line takes worker_timeout: a step that never returns in an env worker ends
    learn() with a WorkerError naming that worker and showing where it is stuck."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.monitor import Monitor

    import auturi

    os.mkfifo(tmp_path / "fifo")
    make = functools.partial(BlockingEnv, str(tmp_path), 5, os.getpid())
    model = PPO("MlpPolicy", make_vec_env(make, n_envs=4), n_steps=16, seed=0, device="cpu")
    model = auturi.wrap(model, config=auturi.Config(envs_per_actor=4, env_parallel_degree=2),
                        env_fn=lambda: Monitor(make()), worker_timeout=1.5)
    try:
        with pytest.raises(auturi.WorkerError) as info:
            model.learn(64)
        assert "env worker 1" in info.value.worker
        assert "helpers.py" in info.value.stack and " in step" in info.value.stack  # BlockingEnv.step
    finally:
        model.auturi.close()


def test_typed_budget_arguments_and_the_deprecated_dict():
    from auturi.adapters.common import resolve_budget

    assert resolve_budget() == {}
    assert resolve_budget(budget_trials=3, budget_seconds=20) == {"budget_trials": 3, "budget_seconds": 20.0}
    assert resolve_budget(tuner_options={"cache": False}, budget_trials=2) == {"cache": False, "budget_trials": 2}
    with pytest.warns(DeprecationWarning, match="budget_trials="):
        assert resolve_budget(4) == {"budget_trials": 4}
    for bad in ({"budget_trials": 0}, {"budget_trials": 2.5}, {"budget_seconds": -1}, {"budget_seconds": "soon"}):
        with pytest.raises(ValueError, match="must be a positive"):
            resolve_budget(**bad)
    with pytest.raises(TypeError, match="tuner_options"):
        resolve_budget(tuner_options=[("cache", False)])
