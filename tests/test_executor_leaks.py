"""close() releases every OS resource it made at once, not when the garbage collector runs:
checked right after close() with the collector off, for every config of the contract suite,
after a WorkerError, and for a worker that finds its semaphores gone as it starts (the caller
closed during a reconfigure): it leaves without printing anything."""
from __future__ import annotations

import functools
import gc
import os
import subprocess
import sys
import textwrap

import pytest

from auturi import Config, WorkerError, make_executor
from auturi.envs import CountingEnv
from tests.conftest import our_segments
from tests.helpers import ObsHashPolicy, SuicideEnv
from tests.test_executor_contract import CONFIGS, ids

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def no_gc():
    gc.collect()  # what earlier tests left
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("config", CONFIGS, ids=ids)
def test_close_leaves_no_segment_or_semaphore_without_gc(config, no_gc):
    before = our_segments()
    ex = make_executor(CountingEnv, ObsHashPolicy(CountingEnv().action_space), num_envs=4, config=config,
                       backend="shm")
    ex.collect(5)
    ex.reconfigure(Config.serial(4) if config != Config.serial(4) else Config(envs_per_actor=4,
                                                                              env_parallel_degree=2))
    ex.collect(3)
    ex.close()
    assert our_segments() - before == set()


def test_a_worker_error_leaves_nothing_without_gc(no_gc):
    before = our_segments()
    env_fn = functools.partial(SuicideEnv, kill_step=3, main_pid=os.getpid())
    ex = make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=4, backend="shm",
                       config=Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2))
    with pytest.raises(WorkerError):
        ex.collect(10)
    assert our_segments() - before == set()


GONE_SCRIPT = textwrap.dedent("""
    from auturi import Config, WorkerError, make_executor
    from auturi.envs import CountingEnv
    from auturi.executor.shm import channel, processes
    from tests.helpers import ObsHashPolicy

    start = processes.start_without_main

    def start_after_close(proc):  # as if the caller closed (Ctrl-C) while this worker starts
        for arg in proc._args:
            if isinstance(arg, channel.Semaphore):
                arg.unlink_name()
        start(proc)

    processes.start_without_main = start_after_close
    try:
        make_executor(CountingEnv, ObsHashPolicy(CountingEnv().action_space), num_envs=4, backend="shm",
                      config=Config(envs_per_actor=4, env_parallel_degree=2))
    except WorkerError as e:
        print("worker error:", e.reason)
""")


def test_a_worker_whose_semaphores_are_gone_leaves_silently():
    """Ctrl-C during a reconfigure printed a child's FileNotFoundError (SemLock._rebuild) after
    "interrupted": nothing of a worker's shutdown may reach the user's terminal."""
    out = subprocess.run([sys.executable, "-c", GONE_SCRIPT], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("worker error: exited unexpectedly"), out.stdout
    assert out.stderr == ""
