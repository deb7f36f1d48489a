"""What an env returns is checked against gymnasium's API and its declared spaces (issue 13
item 6): each env's first reset and first step, with errors that name the env, the space,
what came back and the fix; values the rollout's dtype cannot hold are reported once per env;
an exception an env raises names the env. Serial and shm backends, in-process and in workers.
"""
from __future__ import annotations

import functools
import warnings

import gymnasium as gym
import numpy as np
import pytest

from auturi import Config, make_executor
from auturi.envs import CountingEnv, FaultyEnv
from auturi.errors import WorkerError
from auturi.executor.env_runner import EnvRunner
from auturi.executor.spec import EnvCheckError, probe_reset
from tests.helpers import MisbehavingEnv, ObsHashPolicy

SERIAL = ("serial", Config.serial(2))
ENV_IN_WORKER = ("shm", Config(num_actors=1, envs_per_actor=2, env_parallel_degree=2))  # env 1 in a worker
REPLICAS = ("serial", Config(num_actors=1, envs_per_actor=2, policies_per_actor=2, policy_batch_size=1))  # step()


def collect(env_fns, backend, config, steps=(6,)):
    with make_executor(env_fns, ObsHashPolicy(gym.spaces.Discrete(3)), config=config, backend=backend) as ex:
        return [ex.collect(s) for s in steps]


def failure_text(env_fns, backend, config) -> str:
    """The error collecting raises, as the user reads it: the message, with a worker's traceback."""
    with pytest.raises((EnvCheckError, WorkerError)) as e:
        collect(env_fns, backend, config)
    if backend == "shm":  # env 1 steps in a worker process
        assert isinstance(e.value, WorkerError), e.value
    else:
        assert isinstance(e.value, EnvCheckError), e.value
    return str(e.value)


def bad_env_1(fault):
    return [CountingEnv, functools.partial(MisbehavingEnv, fault)]


@pytest.mark.parametrize("backend,config", [SERIAL, ENV_IN_WORKER], ids=["serial", "shm-worker"])
@pytest.mark.parametrize("fault,expect", [
    ("old_step", ["env 1: step() returned a tuple of 4", "gym<0.26", "GymV21Environment-v0", "shimmy"]),
    ("old_reset", ["env 1: reset() returned an array of shape (4,)", "not (obs, info)", "GymV21Environment-v0"]),
    ("short_obs", ["env 1: step() returned an observation of shape (1,)", "Box(-inf, inf, (4,), float32)",
                   "have shape (4,)"]),
    ("long_reset_obs", ["env 1: reset() returned an observation of shape (5,)", "Box(-inf, inf, (4,), float32)"]),
    ("array_reward", ["env 1: step()", "reward array([", "not a real scalar"]),
    ("no_info", ["env 1: step()", "info is a NoneType, not a dict"]),
])
def test_bad_env_output_names_env_space_and_fix(fault, expect, backend, config):
    text = failure_text(bad_env_1(fault), backend, config)
    for part in expect:
        assert part in text, (part, text)


def test_probe_checks_the_reset_api():
    """The executor's probe (a copy of env 0) can check its reset the same way."""
    with pytest.raises(EnvCheckError, match=r"env 0: reset\(\) returned an array .*GymV21Environment-v0"):
        probe_reset(MisbehavingEnv("old_reset"), 0)
    np.testing.assert_array_equal(probe_reset(CountingEnv(), 3), CountingEnv().reset(seed=3)[0])


def our_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "cannot hold" in str(w.message)]


@pytest.mark.parametrize("backend", ["serial", "shm"])
def test_values_out_of_float32_range_warn_once_per_env(backend):
    """1e300 at every step of both envs (in the caller's process under shm too: an actor in
    the caller with degree 1): one warning per env over two collects, naming env, value and
    space; the value is stored as inf (as numpy casts). Env 2's values are in range: no warning."""
    fns = [functools.partial(MisbehavingEnv, "huge")] * 2 + [CountingEnv]
    cfg = Config.serial(3) if backend == "serial" else Config(num_actors=1, envs_per_actor=3)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        rollouts = collect(fns, backend, cfg, steps=(5, 5))
    got = our_warnings(record)
    assert sorted(w.split(":")[0] for w in got) == ["env 0", "env 1"], got
    assert "np.float64(1e+300) at (1,), stored as np.float32(inf)" in got[0]
    assert "Box(-inf, inf, (4,), float32)" in got[0]
    r = rollouts[1]
    stepped = ~r.episode_starts[:, :2]  # a reset's observation is in range
    assert stepped.any() and np.isinf(r.observations[:, :2, 1][stepped]).all()


def test_checks_run_once_then_step_aside():
    """After an env's first step the runner holds the env itself: no stepping path pays for
    the check again (a bad output later is not checked: the check is on the first only)."""
    r = EnvRunner([0, 1], [CountingEnv] * 2, seed=0)
    T = 3
    r.bind({"obs": np.zeros((T + 1, 2, 4), np.float32), "starts": np.zeros((T + 1, 2), bool),
            "actions": np.ones((T, 2), np.int64), "rewards": np.zeros((T, 2)),
            "terminated": np.zeros((T, 2), bool), "truncated": np.zeros((T, 2), bool)})
    r.reset_all()
    assert not any(type(e) is CountingEnv for e in r.envs.values())
    r.step_one(0, 0)
    assert type(r.envs[0]) is CountingEnv and type(r.envs[1]) is not CountingEnv
    r.step_slice(1, 0, 2)
    assert all(type(e) is CountingEnv for e in r.envs.values())
    r.close()


@pytest.mark.parametrize("backend,config", [SERIAL, REPLICAS, ENV_IN_WORKER],
                         ids=["serial-step_slice", "serial-step", "shm-worker-step_one"])
@pytest.mark.parametrize("fault,where", [
    (dict(fail_step=2), "(raised by env 1 in step() at row 1)"),
    (dict(fail_reset=2, max_len=3), "(raised by env 1 in reset() after its episode ended at row 2)"),
    (dict(fail_reset=1), "(raised by env 1 in its first reset())"),
])
def test_an_env_exception_names_the_env(fault, where, backend, config):
    """In the caller the exception keeps its type and gains a note naming the env; from a
    worker it is a WorkerError whose traceback carries the same note."""
    fns = [CountingEnv, functools.partial(FaultyEnv, **fault)]
    with pytest.raises((RuntimeError, WorkerError)) as e:
        collect(fns, backend, config, steps=(6, 6))
    if isinstance(e.value, WorkerError):
        assert backend == "shm" and where in e.value.traceback, e.value.traceback
    else:
        assert backend == "serial" and "fails on purpose" in str(e.value)
        assert where in getattr(e.value, "__notes__", []), getattr(e.value, "__notes__", None)
