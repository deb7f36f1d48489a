"""Deferred envs (``EnvRunner(defer=True)``, ``make_executor(..., defer_envs=True)``): the
caller's envs of the first layout are made at their first reset or env call, so envs an
online tuner moves to env workers before any collect are made only where they land, and the
data is the serial loop's either way."""
from __future__ import annotations

import os

import numpy as np
import pytest

from auturi import Config, make_executor
from auturi.envs import CountingEnv
from auturi.executor.env_runner import EnvRunner
from tests.helpers import ObsHashPolicy, assert_same

N, T = 6, 5


class Made:
    """A picklable factory of ``CountingEnv`` that logs the pid of every process it made one in."""

    def __init__(self, log: str):
        self.log = log

    def __call__(self) -> CountingEnv:
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return CountingEnv()


def _made_in(log: str, pid: int) -> int:
    if not os.path.exists(log):
        return 0
    with open(log) as f:
        return sum(int(line) == pid for line in f)


def test_a_deferring_runner_makes_envs_at_first_reset_or_call_and_never_those_it_hands_on(tmp_path):
    log = str(tmp_path / "made")
    fns = [Made(log)] * N
    r = EnvRunner(range(N), fns, seed=3, defer=True)
    assert _made_in(log, os.getpid()) == 0 and r.fresh
    assert r.take_envs([4, 5]) == {}  # never made, never reset: their new runner makes them anew
    assert r.export_envs() == dict.fromkeys(range(4))
    from auturi.executor.env_calls import EnvCall

    got = r.call(EnvCall("get", "max_len", ids=(1,)))  # an env call makes that env only
    assert list(got.values()) == [CountingEnv().max_len] and _made_in(log, os.getpid()) == 1
    arrays = {"obs": np.zeros((2, N, *CountingEnv().observation_space.shape), np.float32),
              "starts": np.zeros((2, N), bool)}
    r.bind(arrays)
    r.reset_all()  # makes the rest it still owns (0, 2, 3)
    assert _made_in(log, os.getpid()) == 4 and r.env_ids == [0, 1, 2, 3] and not r.fresh
    eager = EnvRunner(range(4), [CountingEnv] * 4, seed=3)
    ref = {"obs": np.zeros_like(arrays["obs"]), "starts": np.zeros_like(arrays["starts"])}
    eager.bind(ref)
    eager.reset_all()
    np.testing.assert_array_equal(arrays["obs"][0, :4], ref["obs"][0, :4])
    r.close()
    eager.close()


@pytest.mark.parametrize("to", [Config(envs_per_actor=N, env_parallel_degree=3), Config.serial(N)])
def test_deferred_start_envs_moved_before_a_collect_are_made_only_where_they_land(tmp_path, to):
    log = str(tmp_path / "made")
    pol = ObsHashPolicy(CountingEnv().action_space)
    with make_executor(CountingEnv, pol, N, config=Config.serial(N), backend="serial", seed=7) as ex:
        want = ex.collect(T)
    before = _made_in(log, os.getpid())
    with make_executor([Made(log)] * N, pol, N, config=Config.serial(N), backend="shm", seed=7,
                       defer_envs=True) as ex:
        probe = _made_in(log, os.getpid()) - before  # the executor's probe env, made at start
        ex.reconfigure(to)
        got = ex.collect(T)
    here = _made_in(log, os.getpid()) - before - probe
    moved = N - N // to.env_parallel_degree  # the envs of shares 1.. went to env workers
    assert here == N - moved  # only the envs this process kept were made here
    assert_same([got], [want])
