"""How an env worker waits for its next row in the lockstep loop (``row_wait.row_spin``): it
polls (yielding) while the layout's processes fit the cores, and blocks at once when they
outnumber them, where polling only took turns with the workers that had a row to step
(issue 19 item 4, counted with ``python -m bench.rowcount``). The data stays the serial
loop's either way."""
from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np

import auturi
from auturi.executor.shm import row_wait
from tests.helpers import assert_same


def _ended_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_row_spin_blocks_only_when_processes_outnumber_cores():
    ctrl = {"pid": np.array([os.getpid(), os.getppid(), 0, _ended_pid()], np.int64)}
    assert row_wait.live_processes(ctrl) == 3  # the caller, and the two live pids; not the ended one
    assert row_wait.row_spin(ctrl, 1e-3, cores=2) == 0.0
    assert row_wait.row_spin(ctrl, 1e-3, cores=3) == 1e-3
    assert row_wait.row_spin(ctrl, 1e-3, cores=0) == 1e-3  # cores unknown: as before


def _voluntary_switches(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches in /proc/{pid}/status")


def test_outnumbered_env_workers_block_between_rows_and_keep_the_data():
    """One env per process, one process more than the cores: every worker blocks once per
    row (a voluntary context switch each), where polling workers found most rows posted
    without blocking; and the rollout is the serial loop's."""
    n = row_wait.usable_cores() + 1
    rows = 200
    policy = auturi.ConstantPolicy(gym.spaces.Discrete(2))
    serial = auturi.make_executor("CartPole-v1", policy, n, config=auturi.Config.serial(n), backend="serial", seed=5)
    shm = auturi.make_executor("CartPole-v1", policy, n, config=auturi.Config(envs_per_actor=n, env_parallel_degree=n),
                               backend="shm", seed=5)
    with serial, shm:
        want = [serial.collect(16), serial.collect(rows)]
        first = shm.collect(16)  # workers started and in their row loop
        pids = [s.proc.pid for s in shm._slots]
        assert len(pids) == n - 1
        before = [_voluntary_switches(p) for p in pids]
        got = [first, shm.collect(rows)]
        after = [_voluntary_switches(p) for p in pids]
        assert_same(want, got)
    blocked = [b - a for a, b in zip(before, after)]
    assert all(k >= rows - 1 for k in blocked), blocked  # the wait for the first row may have begun before
