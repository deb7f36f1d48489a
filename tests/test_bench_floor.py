"""bench/floor.py, the bare prototype `bench/envstep.py` measures degree N against: its
``caller_env`` form (the caller steps one of the N envs, as Auturi's actor steps its share)
starts one worker fewer, steps, and leaves no process behind."""
from __future__ import annotations


import pytest

pytest.importorskip("gymnasium")

from bench.envstep import COLUMNS, DEFAULT_COLUMNS, makers  # noqa: E402
from bench.floor import FloorRunner  # noqa: E402


@pytest.mark.parametrize("caller_env", [False, True])
def test_floor_runs_n_envs_and_ends_its_workers(caller_env):
    r = FloorRunner(3, caller_env=caller_env)
    try:
        assert len(r.procs) == (2 if caller_env else 3)
        assert (r.env is not None) == caller_env
        assert r.run(20) > 0
        assert all(p.is_alive() for p in r.procs)
    finally:
        r.close()
    assert all(p.exitcode == 0 for p in r.procs)  # ended by the stop flag, not killed


def test_floor_caller_is_asked_for_by_name():
    assert "floor_caller" in COLUMNS and "floor_caller" not in DEFAULT_COLUMNS
    assert "floor_caller" not in makers(4)
    assert set(makers(4, ("floor", "floor_caller"))) == {"floor", "floor_caller"}
