"""What an env returns is checked against gymnasium's API and its declared spaces on every
reset and step (issue 13 item 6, issue 30 items 3 and 7): errors name the env, the row, the
space, what came back and the fix, and are the same EnvCheckError whatever the layout (from
a worker, a WorkerError too); values the rollout's dtype cannot hold are reported once per env;
an exception an env raises names the env. And an env that never returns in the caller's own
process is a WorkerError after worker_timeout, not a hang (issue 30 item 4).
"""
from __future__ import annotations

import functools
import os
import pickle
import threading
import warnings

import gymnasium as gym
import numpy as np
import pytest

from auturi import Config, EnvCheckError, WorkerError, make_executor
from auturi.envs import CountingEnv, FaultyEnv, env_seed
from auturi.errors import WorkerEnvCheckError
from auturi.executor.env_runner import EnvRunner
from auturi.executor.spec import probe_reset
from tests.helpers import LooseTypesEnv, MisbehavingEnv, ObsHashPolicy, StuckEnv

SERIAL = ("serial", Config.serial(2))
ENV_IN_WORKER = ("shm", Config(num_actors=1, envs_per_actor=2, env_parallel_degree=2))  # env 1 in a worker
REPLICAS = ("serial", Config(num_actors=1, envs_per_actor=2, policies_per_actor=2, policy_batch_size=1))  # step()


def collect(env_fns, backend, config, steps=(6,), **kw):
    with make_executor(env_fns, ObsHashPolicy(gym.spaces.Discrete(3)), config=config, backend=backend, **kw) as ex:
        return [ex.collect(s) for s in steps]


def failure_text(env_fns, backend, config, **kw) -> str:
    """The error collecting raises, as the user reads it: the message, with a worker's traceback.
    The same EnvCheckError wherever the env runs; from a worker process a WorkerError too."""
    with pytest.raises(EnvCheckError) as e:
        collect(env_fns, backend, config, **kw)
    in_worker = backend == "shm"  # every layout used here steps the bad env in a worker process
    assert isinstance(e.value, WorkerError) == in_worker, repr(e.value)
    return str(e.value)


def bad_env_1(fault):
    return [CountingEnv, functools.partial(MisbehavingEnv, fault)]


@pytest.mark.parametrize("backend,config", [SERIAL, ENV_IN_WORKER], ids=["serial", "shm-worker"])
@pytest.mark.parametrize("fault,expect", [
    ("old_step", ["env 1: step() returned a tuple of 4", "gym<0.26", "GymV21Environment-v0", "shimmy"]),
    ("old_reset", ["env 1: reset() returned an array of shape (4,)", "not (obs, info)", "GymV21Environment-v0",
                   "(raised by env 1 in its first reset())"]),
    ("short_obs", ["env 1: step() returned an observation of shape (1,)", "Box(-inf, inf, (4,), float32)",
                   "have shape (4,)", "(raised by env 1 in step() at row 0)"]),
    ("long_reset_obs", ["env 1: reset() returned an observation of shape (5,)", "Box(-inf, inf, (4,), float32)"]),
    ("array_reward", ["env 1: step()", "reward array([", "not a real scalar"]),
    ("no_info", ["env 1: step()", "info is a NoneType, not a dict"]),
])
def test_bad_env_output_names_env_space_and_fix(fault, expect, backend, config):
    text = failure_text(bad_env_1(fault), backend, config)
    for part in expect:
        assert part in text, (part, text)


# Four envs, the bad one env 3: in the caller (serial), in an env worker (1 actor, degree 2:
# worker 1 steps envs 2-3) and in an actor process (2 actors x 2 envs: actor 1 steps envs 2-3).
LAYOUTS = {
    "serial": ("serial", Config.serial(4)),
    "shm-degree2": ("shm", Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2)),
    "shm-2actors": ("shm", Config(num_actors=2, envs_per_actor=2)),
}
LATER_FAULTS = {  # from the env's 3rd step on (row 2 of the first collect): the first steps pass
    "short_obs": ["env 3: step() returned an observation of shape (1,)", "Box(-inf, inf, (4,), float32)",
                  "whose observations have shape (4,)", "Return observations of the declared shape"],
    "none_obs": ["env 3: step() returned an observation that is a NoneType (numpy dtype object), not numeric",
                 "Return a numpy array of the declared shape (4,) and dtype float32"],
    "str_reward": ["env 3: step() returned (obs, reward, terminated, truncated, info) with reward '1.5' (str) "
                   "is not a real scalar", "float(x) converts a numeric string"],
    "none_reward": ["env 3: step()", "reward None (NoneType) is not a real scalar"],
    "none_flag": ["env 3: step()", "terminated None (NoneType) is not a bool"],
    "nan_obs": ["env 3: step() returned an observation with 1 non-finite value(s) (e.g. np.float32(nan) at (2,))",
                "check_finite is on"],
    "nan_reward": ["env 3: step() returned the reward nan", "check_finite is on"],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("fault", list(LATER_FAULTS))
def test_every_step_is_checked_with_the_same_error_in_every_layout(fault, layout):
    """Before, only each env's first step was checked: a (1,) observation later was broadcast
    into all four slots, None became NaN, "1.5" was parsed, a None reward was NaN serially and
    a raw numpy error under 2 actors. Now each is the same EnvCheckError, naming env and row."""
    backend, config = LAYOUTS[layout]
    fns = [CountingEnv] * 3 + [functools.partial(MisbehavingEnv, fault, from_step=3)]
    kw = {"check_finite": True} if fault.startswith("nan") else {}
    text = failure_text(fns, backend, config, **kw)
    for part in LATER_FAULTS[fault] + ["(raised by env 3 in step() at row 2)"]:
        assert part in text, (part, text)


@pytest.mark.parametrize("backend,config", [
    ("serial", Config(num_actors=1, envs_per_actor=4, policies_per_actor=2, policy_batch_size=1)),
    ("shm", Config(num_actors=1, envs_per_actor=4, env_parallel_degree=4)),
], ids=["serial-step", "shm-step_one"])
def test_the_other_stepping_paths_check_every_step(backend, config):
    """The gathered path (EnvRunner.step: replicas with batches of 1) and the one-env worker's
    (step_one) raise the same words as step_slice above."""
    fns = [CountingEnv] * 3 + [functools.partial(MisbehavingEnv, "short_obs", from_step=3)]
    text = failure_text(fns, backend, config)
    assert "env 3: step() returned an observation of shape (1,)" in text, text
    assert "(raised by env 3 in step() at row 2)" in text, text


def test_non_finite_values_pass_unless_check_finite():
    """check_finite is off by default, as in gymnasium's checker: NaN is stored as it is."""
    fns = [CountingEnv, functools.partial(MisbehavingEnv, "nan_obs", from_step=3),
           functools.partial(MisbehavingEnv, "nan_reward", from_step=3)]
    with np.errstate(invalid="ignore"):  # the test policy hashes the NaN
        r = collect(fns, "serial", Config.serial(3))[0]
    assert np.isnan(r.observations[3:, 1, 2]).all() and np.isnan(r.rewards[2:, 2]).all()
    assert np.isfinite(r.observations[:, 0]).all() and np.isfinite(r.observations[:3, 1]).all()


def test_loose_but_valid_types_are_stored_as_they_are():
    """float64 observations for a float32 Box, np.float32 / 0-d array / bool / int rewards,
    np.bool_ and 0/1 flags: accepted (the thorough check's path), stored as the values they are."""
    n, steps = 2, 8
    r = collect([LooseTypesEnv] * n, "serial", Config.serial(n), steps=(steps,))[0]
    for i in range(n):  # replay env i by hand with the rollout's actions
        env = LooseTypesEnv()
        obs, _ = env.reset(seed=env_seed(0, i, 0))
        for t in range(steps):
            np.testing.assert_array_equal(r.observations[t, i], obs.astype(np.float32))
            obs, rew, te, tr, _ = env.step(r.actions[t, i])
            assert r.rewards[t, i] == float(rew) and r.terminated[t, i] == bool(te)
            assert r.truncated[t, i] == (bool(tr) and not bool(te))
            if te or tr:
                obs, _ = env.reset()


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


def test_check_finite_catches_values_the_cast_overflows():
    """With check_finite, 1e300 stored as float32 inf is an error too (the rollout is what counts)."""
    fns = [CountingEnv, functools.partial(MisbehavingEnv, "huge", from_step=2)]
    text = failure_text(fns, "serial", Config.serial(2), check_finite=True)
    assert "np.float32(inf) at (1,), returned as np.float64(1e+300), beyond float32's range" in text, text


def runner_of(env_fns, T=4, **kw) -> EnvRunner:
    n = len(env_fns)
    r = EnvRunner(range(n), env_fns, seed=0, **kw)
    r.bind({"obs": np.zeros((T + 1, n, 4), np.float32), "starts": np.zeros((T + 1, n), bool),
            "actions": np.ones((T, n), np.int64), "rewards": np.zeros((T, n)),
            "terminated": np.zeros((T, n), bool), "truncated": np.zeros((T, n), bool)})
    return r


def test_the_stand_ins_stay_and_check_every_path():
    """Every env stays behind its checking stand-in after its first step, and each stepping
    path (step_one, step_slice, step) raises on a bad output at a later row."""
    for path in ("step_one", "step_slice", "step"):
        r = runner_of([CountingEnv, functools.partial(MisbehavingEnv, "short_obs", from_step=3)])
        r.reset_all()
        for t in range(2):
            r.step_slice(t, 0, 2)
        assert not any(type(e) in (CountingEnv, MisbehavingEnv) for e in r.envs.values())
        call = {"step_one": lambda: r.step_one(2, 1), "step_slice": lambda: r.step_slice(2, 0, 2),
                "step": lambda: r.step([2, 2], [0, 1])}[path]
        with pytest.raises(EnvCheckError, match=r"env 1: step\(\) returned an observation of shape \(1,\).*at row 2"):
            call()
        r.close()


class DriftingEnv(CountingEnv):
    """An int flag and a 0-d array reward (valid) for two steps, then 2 and a 1-d array."""

    def __init__(self):
        super().__init__()
        self._n = 0

    def step(self, action):
        obs, r, te, tr, info = super().step(action)
        self._n += 1
        if self._n < 3:
            return obs, np.array(r), int(te), tr, info
        return obs, np.array([r]), 2, tr, info


def test_what_values_decide_is_checked_in_full_every_time():
    """The fast path accepts a signature the thorough check accepted only where types decide:
    an int flag and a 0-d array reward are looked at again on every step."""
    r = runner_of([DriftingEnv])
    r.reset_all()
    r.step_one(0, 0)
    r.step_one(1, 0)
    with pytest.raises(EnvCheckError, match=r"reward array\(\[.*not a real scalar; terminated 2 \(int\) is not a bool"):
        r.step_one(2, 0)
    r.close()


def test_check_steps_off_checks_the_first_calls_only():
    """The bench's baseline (bench/envcheck.py): each env steps aside after its first step."""
    r = runner_of([CountingEnv] * 2, check_steps=False)
    r.reset_all()
    r.step_one(0, 0)
    assert type(r.envs[0]) is CountingEnv and type(r.envs[1]) is not CountingEnv
    r.step_slice(1, 0, 2)
    assert all(type(e) is CountingEnv for e in r.envs.values())
    r.close()


def test_on_progress_is_called_after_each_env_call():
    """Once per reset and step of each env, on every path (no episode ends in 2 steps: they
    last 3 or more); not once unset."""
    calls = []
    r = runner_of([CountingEnv] * 3)
    r.on_progress = lambda: calls.append(1)
    r.reset_all()
    assert len(calls) == 3
    r.step_one(0, 0)
    r.step_slice(0, 1, 3)
    assert len(calls) == 6
    r.step([1, 1, 1], [0, 1, 2])
    assert len(calls) == 9 and not r.finals
    r.on_progress = None
    r.step_slice(2, 0, 3)
    r.step_one(3, 0)
    assert len(calls) == 9
    r.close()


def test_a_workers_env_check_error_is_both_and_survives_pickling():
    """The type a Ray actor sends back keeps both faces and its fields."""
    tb = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in step\n"
          "auturi.errors.EnvCheckError: env 3: step() returned an observation of shape (1,) (raised by env 3 in "
          "step() at row 2)\n")
    e = WorkerError("env worker 1 of actor 0 (envs 2-3)", "raised an exception", tb, Config.serial(4))
    assert type(e) is WorkerEnvCheckError and isinstance(e, EnvCheckError)
    assert e.check.startswith("env 3: step() returned an observation of shape (1,)")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is WorkerEnvCheckError and back.worker == e.worker and str(back) == str(e)
    # an env check error the worker caught, then another exception: not an env check failure
    chained = tb + "\nDuring handling of the above exception, another exception occurred:\n\n" + \
        "Traceback (most recent call last):\n  File \"y.py\", line 2\nRuntimeError: boom\n"
    assert type(WorkerError("w", "raised an exception", chained)) is WorkerError


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


# ---------------------------------------------------------------------------- the caller's watchdog
TIMEOUT = 1.0


def stuck_collect(env, config=Config.serial(2)):
    """Collect on [CountingEnv, env] in the caller's process; the error it raises."""
    with pytest.raises(WorkerError) as e:
        collect([CountingEnv, env], "serial", config, worker_timeout=TIMEOUT)
    return e.value


@pytest.mark.parametrize("config", [Config.serial(2), REPLICAS[1]], ids=["serial", "serial-2-replicas"])
def test_an_env_stuck_in_python_in_the_callers_process_is_a_worker_error(capfd, config):
    """Before, the serial layout (SB3's default) hung forever whatever worker_timeout said.
    Now: a warning with the stack on stderr, then a WorkerError naming the env, with its stack."""
    err = stuck_collect(functools.partial(StuckEnv, "python"), config)
    assert err.worker == "env 1 (in the caller's process, serial backend)", err.worker
    assert "made no progress for" in err.reason and "worker_timeout (now 1 s)" in err.reason
    assert "auturi.wrap(...), auturi.tune(...) or make_executor(...)" in err.reason  # whichever face ran it
    assert "in step" in err.stack and "helpers.py" in err.stack.splitlines()[0], err.stack
    assert err.config == config
    printed = capfd.readouterr().err
    assert "auturi: env 1 (in the caller's process, serial backend) made no progress" in printed
    assert "helpers.py" in printed


def test_an_env_blocked_in_a_system_call_is_interrupted(tmp_path):
    """A read that never returns (a FIFO nobody writes) is interrupted too: the signal's
    handler raises in the main thread. A timer opens the FIFO after 30 s so that a failure
    fails this test rather than hanging the suite."""
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    release = threading.Timer(30.0, lambda: open(fifo, "w").close())
    release.start()
    try:
        err = stuck_collect(functools.partial(StuckEnv, "fifo", path=fifo))
    finally:
        release.cancel()
    assert err.worker.startswith("env 1 ") and "in step" in err.stack


def test_a_collect_from_another_thread_is_watched_too():
    """Off the main thread no signal handler runs: the watchdog raises at the env's next
    bytecode (PyThreadState_SetAsyncExc), which a loop of Python code reaches."""
    out = {}

    def body():
        try:
            collect([CountingEnv, functools.partial(StuckEnv, "python")], "serial", Config.serial(2),
                    worker_timeout=TIMEOUT)
        except BaseException as e:  # whatever it is, the test reads it
            out["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert isinstance(out.get("error"), WorkerError) and out["error"].worker.startswith("env 1 "), out


def test_slow_envs_that_progress_are_not_stuck():
    """A row of 3 envs x 0.45 s lasts longer than the 1 s timeout; each env call does not:
    the timeout bounds one env's silence, not a row's."""
    slow = functools.partial(CountingEnv, step_seconds=0.45)
    rollout = collect([slow] * 3, "serial", Config.serial(3), steps=(2,), worker_timeout=TIMEOUT)[0]
    assert rollout.rewards.shape == (2, 3)
    assert [t.name for t in threading.enumerate() if t.name.startswith("auturi watchdog")] == []
