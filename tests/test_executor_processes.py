"""Worker processes. Workers and actors poll their semaphore for up to a millisecond, yielding their core between
polls, then block: between collects waiting costs no CPU. Replicas start with what their policy asks to be
preloaded."""
from __future__ import annotations

import os
import sys
import time

import gymnasium as gym
import numpy as np
import psutil
import pytest

from auturi import Config, ConstantPolicy, make_executor
from auturi.envs import CountingEnv
from auturi.executor.shm import ShmExecutor
from auturi.executor.shm.channel import SPIN_SECONDS


def test_a_polling_waiter_yields_its_core_between_polls(monkeypatch):
    """Waiters poll before blocking, whatever the number of processes per core, and that is only
    safe because each poll gives the core to whoever else has work there (without the yield,
    a poller holds its core for a whole time slice while the process it waits for cannot run:
    the thesis' collapse). Polling a semaphore nobody posts must yield between polls, stop
    after the spin window, and then block."""
    import multiprocessing as mp

    from auturi.executor.shm import channel

    yields = []
    monkeypatch.setattr(channel, "_yield", lambda: yields.append(1))
    sem = mp.get_context("spawn").Semaphore(0)
    assert channel.acquire(sem, 0.01, 0.01) is False
    assert len(yields) > 10
    sem.release()
    yields.clear()
    assert channel.acquire(sem, 0.01, 0.01) is True
    assert yields == []  # a posted semaphore is taken at once
    monkeypatch.delenv("AUTURI_SPIN_SECONDS", raising=False)
    assert ShmExecutor._spin_seconds() == SPIN_SECONDS > 0  # however many processes per core
    monkeypatch.setenv("AUTURI_SPIN_SECONDS", "0")
    assert ShmExecutor._spin_seconds() == 0.0


@pytest.mark.parametrize("degree", [2, 4])
def test_idle_workers_use_no_cpu_between_collects(degree):
    with make_executor(CountingEnv, ConstantPolicy(gym.spaces.Discrete(3)), num_envs=4,
                       config=Config(envs_per_actor=4, env_parallel_degree=degree), backend="shm") as ex:
        ex.collect(200)  # workers have stepped (and polled) until just now
        # The executor's own workers: other children of this process (another test's server)
        # may come and go, and one gone between the listing and its cmdline failed this test.
        workers = [psutil.Process(s.proc.pid) for s in ex._slots]
        assert len(workers) == degree - 1
        before = sum(sum(p.cpu_times()[:2]) for p in workers)
        t0 = time.perf_counter()
        time.sleep(1.0)  # the measurement window, not a synchronisation
        window = time.perf_counter() - t0
        used = sum(sum(p.cpu_times()[:2]) for p in workers) - before
        # A polling or spinning worker would use about `window` seconds of CPU each.
        assert used < 0.05 * window * len(workers), (used, len(workers))


class PreloadProbe:
    """Reports, as an extra, whether its module was imported before the replica unpickled it."""

    noise_dim = 0
    preload_modules = ("xml.dom.minidom",)

    def __init__(self):
        self.preloaded = False

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.preloaded = "xml.dom.minidom" in sys.modules

    def act(self, obs, noise):
        n = len(obs)
        return np.zeros(n, np.int64), {"preloaded": np.full(n, self.preloaded)}

    def get_state(self):
        return {}

    def load_state(self, state):
        pass

    def to(self, device):
        pass


def test_policy_preload_modules_are_imported_before_replicas_start():
    pytest.importorskip("torch")  # replicas fork from the torch forkserver once torch is here
    cfg = Config(envs_per_actor=4, policies_per_actor=2, policy_batch_size=2)
    with make_executor(CountingEnv, PreloadProbe(), num_envs=4, config=cfg, backend="shm") as ex:
        r = ex.collect(3)
    assert r.extras["preloaded"].all()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
@pytest.mark.parametrize("cfg", [Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2),
                                 Config(num_actors=2, envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2,
                                        policy_batch_size=2)], ids=str)
def test_every_process_runs_on_the_cores_its_plan_names(cfg):
    """The layout plan's pins are what each started process runs under (its lane's core, and
    for an actor running its own CPU policy the free cores its threads use); a process the
    plan leaves unpinned keeps the caller's cores."""
    from auturi.executor.layout import plan_layout

    mine = os.sched_getaffinity(0)
    with make_executor(CountingEnv, ConstantPolicy(gym.spaces.Discrete(3)), num_envs=8, config=cfg,
                       backend="shm") as ex:
        ex.collect(2)
        plan = {p.name: p for p in plan_layout(cfg).processes}
        slots = ex._slots
        assert sorted(s.name for s in slots) == sorted(plan)
        for s in slots:
            want = set(plan[s.name].cpus) or mine
            assert os.sched_getaffinity(s.proc.pid) == want, s.name
